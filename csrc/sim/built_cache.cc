// The built-programs cache (compact.h, built_programs).
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "schedule/registry.h"
#include "sim/compact.h"

namespace commlib {
namespace sim {

namespace {

// Everything build_programs' builders read (ir.h CollArgs) and the registry's generation, exactly.
std::string key_of(Collective c, const Composition& how, int size, int64_t count, int root,
                   const std::vector<int>& host_of) {
  std::string k;
  auto add = [&k](int64_t v) { k += std::to_string(v) + ','; };
  auto add_name = [&k](const std::string& v) { k += std::to_string(v.size()) + ':' + v + ','; };
  add(static_cast<int64_t>(registry_generation()));
  add(static_cast<int64_t>(c));
  add(size), add(count), add(root), add(how.segment), add(how.pieces), add(how.share);
  add_name(how.algorithm), add_name(how.inter), add_name(how.intra);
  k += '|';
  for (int h : host_of) add(h);
  return k;
}

struct Cache {
  std::mutex mu;
  // Most recently used first; the map points into it.
  std::list<std::pair<std::string, std::shared_ptr<const BuiltPrograms>>> lru;
  std::unordered_map<std::string, decltype(lru)::iterator> by_key;
  size_t bytes = 0;
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: simulations may run while the process exits
  return *c;
}

}  // namespace

std::shared_ptr<const BuiltPrograms> built_programs(Collective c, const Composition& how, int size, int64_t count,
                                                    int root, const std::vector<int>& host_of, bool* hit) {
  const std::string key = key_of(c, how, size, count, root, host_of);
  Cache& C = cache();
  {
    std::lock_guard<std::mutex> lock(C.mu);
    auto it = C.by_key.find(key);
    if (it != C.by_key.end()) {
      C.lru.splice(C.lru.begin(), C.lru, it->second);
      if (hit) *hit = true;
      return it->second->second;
    }
  }
  if (hit) *hit = false;
  // Built outside the lock: other threads' look-ups and builds go on meanwhile (two threads
  // building the same call both build; the second keeps the first's entry).
  auto built = std::make_shared<BuiltPrograms>();
  built->programs = build_programs(c, how, size, count, root, host_of, built->shapes, &built->scratch, &built->lanes,
                                   &built->order, &built->window, &built->gates);
  size_t bytes = built->shapes.bytes() + built->scratch.capacity() * sizeof(int64_t) + key.size();
  for (const auto& o : built->order) bytes += o.capacity() * sizeof(uint16_t) + sizeof(o);
  for (const auto& g : built->gates) bytes += g.capacity() * sizeof(int) + sizeof(g);
  for (const Program& p : built->programs) bytes += p.capacity() * sizeof(Program::value_type) + sizeof(Program);
  built->bytes = bytes;
  if (bytes > kBuiltCacheBytes) return built;
  std::lock_guard<std::mutex> lock(C.mu);
  if (C.by_key.count(key)) return C.by_key[key]->second;
  C.lru.emplace_front(key, built);
  C.by_key[key] = C.lru.begin();
  C.bytes += bytes;
  while (C.bytes > kBuiltCacheBytes) {
    C.bytes -= C.lru.back().second->bytes;
    C.by_key.erase(C.lru.back().first);
    C.lru.pop_back();
  }
  return built;
}

void clear_built_programs() {
  Cache& C = cache();
  std::lock_guard<std::mutex> lock(C.mu);
  C.lru.clear();
  C.by_key.clear();
  C.bytes = 0;
}

}  // namespace sim
}  // namespace commlib
