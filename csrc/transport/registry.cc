// The transport table (transport/registry.h): its entries come from the kinds' folders.
#include "transport/registry.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <stdexcept>

namespace commlib {

namespace {

struct Table {
  std::mutex mu;
  std::deque<TransportEntry> entries;  // a deque: entries never move (Domain and the choice point at them)
  std::vector<const TransportEntry*> ordered;
};

Table& table() {
  static Table* t = new Table;  // never destroyed: registrations may run from any object's static init
  return *t;
}

}  // namespace

void register_transport(const TransportEntry& entry) {
  if (entry.name.empty() || entry.name == "self" || !entry.can_connect || !entry.create)
    throw std::invalid_argument("transport: an entry needs a name other than \"self\", can_connect and create");
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  for (const TransportEntry* e : t.ordered)
    if (e->name == entry.name) throw std::invalid_argument("transport: " + entry.name + " is registered already");
  t.entries.push_back(entry);
  t.ordered.push_back(&t.entries.back());
  std::stable_sort(t.ordered.begin(), t.ordered.end(),
                   [](const TransportEntry* a, const TransportEntry* b) { return a->preference < b->preference; });
}

void unregister_transport(const std::string& name) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  for (auto it = t.ordered.begin(); it != t.ordered.end(); ++it)
    if ((*it)->name == name) {
      t.ordered.erase(it);
      return;
    }
  throw std::invalid_argument("transport: " + name + " is not registered");
}

std::vector<const TransportEntry*> transport_table() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.ordered;
}

const TransportEntry* find_transport(const std::string& name) {
  for (const TransportEntry* e : transport_table())
    if (e->name == name) return e;
  return nullptr;
}

std::vector<const TransportEntry*> choose_transports(const FabricInputs& in) {
  const int size = static_cast<int>(in.topo.host_of.size());
  if (in.rank < 0 || in.rank >= size) throw std::invalid_argument("rank: out of range for the host map");
  const std::vector<const TransportEntry*> entries = transport_table();
  std::vector<const TransportEntry*> out(size, nullptr);
  for (int p = 0; p < size; ++p) {
    if (p == in.rank) continue;
    std::string reasons;
    for (const TransportEntry* e : entries) {
      std::string why;
      if (e->can_connect(in, p, &why)) {
        out[p] = e;
        break;
      }
      reasons += (reasons.empty() ? "" : "; ") + e->name + ": " + (why.empty() ? "cannot" : why);
    }
    if (!out[p])
      throw std::invalid_argument("transport: no transport connects rank " + std::to_string(in.rank) + " to rank " +
                                  std::to_string(p) + " (" + reasons + ")");
  }
  return out;
}

}  // namespace commlib
