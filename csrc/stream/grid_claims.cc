// The device-wide grid budget (see grid_claims.h).
#include "stream/grid_claims.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <random>
#include <utility>
#include <stdexcept>

#include "device/shared_ledger.h"

namespace commlib {

namespace {

constexpr unsigned kEntries = 64, kRanks = 64, kHolders = 64;

struct Entry {
  uint64_t comm;  // 0: free
  uint32_t per_rank, ranks;
  int32_t pids[kRanks];          // its ranks' processes on the device (sorted; the first `ranks`)
  ProcessId holders[kHolders];   // processes holding it (its ranks, and peers on other devices)
};
struct Table {
  Entry entries[kEntries];
};

std::mutex counts_mu;
std::map<std::string, GridClaimCounts>& counts() {
  static auto* c = new std::map<std::string, GridClaimCounts>();
  return *c;
}
void count(const std::string& device, uint64_t GridClaimCounts::*field, uint64_t n = 1) {
  std::lock_guard<std::mutex> lk(counts_mu);
  counts()[device].*field += n;
}

unsigned holders_of(const Entry& e) {
  unsigned n = 0;
  for (const ProcessId& h : e.holders) n += h.pid != 0;
  return n;
}

// Drops dead holders; an entry left without one is free again (returns how many such).
uint64_t reclaim_dead(Table& t) {
  uint64_t freed = 0;
  for (Entry& e : t.entries) {
    if (!e.comm) continue;
    for (ProcessId& h : e.holders)
      if (h.pid && !process_alive(h)) h = ProcessId{};
    if (!holders_of(e)) {
      e = Entry{};
      ++freed;
    }
  }
  return freed;
}

bool empty(const Table& t) {
  for (const Entry& e : t.entries)
    if (e.comm) return false;
  return true;
}

bool same_processes(const Entry& e, const std::vector<int32_t>& pids) {
  return e.ranks == pids.size() && std::equal(pids.begin(), pids.end(), e.pids);
}

// Whether every process of `pids` (sorted) holds a rank of `e` on the device.
bool covers(const Entry& e, const std::vector<int32_t>& pids) {
  return e.ranks <= kRanks && std::includes(e.pids, e.pids + e.ranks, pids.begin(), pids.end());
}

}  // namespace

uint64_t random_claim_key() {
  std::random_device rd;
  for (;;) {
    const uint64_t k = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (static_cast<uint64_t>(getpid()) << 16);
    if (k) return k;
  }
}

std::string grid_claims_ledger(const std::string& device) { return ledger_name("grid", device); }

GridGrant GridClaims::claim(const GridClaimRequest& r) {
  if (r.pids.empty() || r.pids.size() > kRanks || !r.comm)
    throw std::invalid_argument("grid claims: a claim for 1.." + std::to_string(kRanks) + " ranks, got " +
                                std::to_string(r.pids.size()));
  std::vector<int32_t> pids = r.pids;
  std::sort(pids.begin(), pids.end());
  const ProcessId me = this_process();
  GridGrant g;
  uint64_t reclaimed = 0;
  bool made = false;
  with_shared_ledger(grid_claims_ledger(r.device), sizeof(Table), [&](void* mem) {
    Table& t = *static_cast<Table*>(mem);
    reclaimed = reclaim_dead(t);
    Entry* mine = nullptr;
    for (Entry& e : t.entries)
      if (e.comm == r.comm) mine = &e;
    for (const Entry& e : t.entries)
      if (e.comm && e.comm != r.comm && !same_processes(e, pids)) {
        g.claimed_by_others += e.per_rank * e.ranks;
        ++g.others;
      }
    if (!mine) {  // the first of the communicator's ranks here: decide for all of them
      for (Entry& e : t.entries)
        if (!mine && !e.comm) mine = &e;
      if (!mine) throw std::runtime_error(r.device + ": more than 64 communicators claim its blocks");
      const unsigned left = r.capacity > g.claimed_by_others ? r.capacity - g.claimed_by_others : 0;
      unsigned per_rank = std::min<unsigned>(r.per_rank, left / static_cast<unsigned>(pids.size()));
      // Within an entry whose processes include all of this one's (a subgroup of a communicator
      // whose engine lives on the same ranks' processes), up to that entry's blocks per rank add no
      // place: each process runs one engine's kernel at a time (LaunchChain).
      for (const Entry& e : t.entries)
        if (e.comm && e.comm != r.comm && covers(e, pids))
          per_rank = std::max(per_rank, std::min<unsigned>(r.per_rank, e.per_rank));
      *mine = Entry{};
      mine->comm = r.comm;
      mine->ranks = static_cast<uint32_t>(pids.size());
      mine->per_rank = per_rank;
      std::copy(pids.begin(), pids.end(), mine->pids);
    }
    bool holding = false;
    for (const ProcessId& h : mine->holders) holding = holding || h == me;
    if (!holding) {
      ProcessId* slot = nullptr;
      for (ProcessId& h : mine->holders)
        if (!slot && !h.pid) slot = &h;
      if (!slot) throw std::runtime_error(r.device + ": more than 64 processes hold one communicator's claim");
      *slot = me;
    }
    g.per_rank = mine->per_rank;
    made = true;
    return false;
  });
  if (made) held_.push_back(Held{r.device, r.comm, g.per_rank});
  count(r.device, &GridClaimCounts::claims);
  if (!g.per_rank) count(r.device, &GridClaimCounts::refused);
  if (reclaimed) count(r.device, &GridClaimCounts::reclaimed, reclaimed);
  return g;
}

void GridClaims::release_one(const Held& h) {
  const ProcessId me = this_process();
  uint64_t reclaimed = 0;
  with_shared_ledger(grid_claims_ledger(h.device), sizeof(Table), [&](void* mem) {
    Table& t = *static_cast<Table*>(mem);
    for (Entry& e : t.entries) {
      if (e.comm != h.comm) continue;
      for (ProcessId& p : e.holders)
        if (p == me) p = ProcessId{};
      if (!holders_of(e)) e = Entry{};
    }
    reclaimed = reclaim_dead(t);
    return empty(t);
  });
  count(h.device, &GridClaimCounts::releases);
  if (reclaimed) count(h.device, &GridClaimCounts::reclaimed, reclaimed);
}

void GridClaims::release() {
  for (const Held& h : held_) release_one(h);
  held_.clear();
}

void GridClaims::release_granted() {
  std::vector<Held> kept;
  for (const Held& h : held_) {
    if (h.per_rank) {
      release_one(h);
    } else {
      kept.push_back(h);
    }
  }
  held_ = std::move(kept);
}

GridClaims::~GridClaims() {
  try {
    release();
  } catch (...) {  // a ledger that cannot be opened now: its entries go with this process
  }
}

GridClaimCounts grid_claim_counts(const std::string& device) {
  std::lock_guard<std::mutex> lk(counts_mu);
  auto it = counts().find(device);
  return it == counts().end() ? GridClaimCounts{} : it->second;
}

std::vector<GridClaimEntry> grid_claim_entries(const std::string& device) {
  std::vector<GridClaimEntry> out;
  if (!shared_ledger_exists(grid_claims_ledger(device))) return out;
  with_shared_ledger(grid_claims_ledger(device), sizeof(Table), [&](void* mem) {
    const Table& t = *static_cast<const Table*>(mem);
    for (const Entry& e : t.entries)
      if (e.comm) out.push_back(GridClaimEntry{e.comm, e.per_rank, e.ranks, holders_of(e)});
    return empty(t);
  });
  return out;
}

}  // namespace commlib
