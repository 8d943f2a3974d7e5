// The vector-clock race check of one-sided schedules (verifier_hazards.h).
#include "verify/verifier_hazards.h"

namespace commlib {
namespace verify {

namespace {

// Whether `prior` happens before an access by rank `by` at clock `vc` (same rank: an earlier step).
bool ordered(const Access& prior, int by, const std::vector<int64_t>& vc) {
  if (prior.rank == by) return prior.time < vc[by];
  return vc[prior.rank] >= prior.time;
}

}  // namespace

void Hazards::init(const std::vector<int64_t>& arena) {
  cells_.assign(arena.size(), {});
  for (size_t q = 0; q < arena.size(); ++q)
    if (arena[q] > 0) cells_[q].emplace(0, Cell{arena[q], Access{static_cast<int>(q), 0, true}, {}});
}

void Hazards::split(int owner, int64_t pos) {
  auto& m = cells_[owner];
  auto it = m.upper_bound(pos);
  if (it == m.begin()) return;
  --it;
  if (it->first == pos || it->second.end <= pos) return;
  Cell right = it->second;
  it->second.end = pos;
  m.emplace(pos, std::move(right));
}

bool Hazards::access(int owner, int64_t a, int64_t n, int by, const std::vector<int64_t>& vc, bool write,
                     Access* prior, int64_t* pos) {
  if (n <= 0) return true;
  split(owner, a);
  split(owner, a + n);
  auto& m = cells_[owner];
  const auto first = m.lower_bound(a);
  for (auto it = first; it != m.end() && it->first < a + n; ++it) {
    const Cell& c = it->second;
    *pos = it->first;
    if (!ordered(c.last_write, by, vc)) {
      *prior = c.last_write;
      return false;
    }
    if (!write) continue;
    for (const Access& rd : c.reads)
      if (!ordered(rd, by, vc)) {
        *prior = rd;
        return false;
      }
  }
  const Access now{by, vc[by], write};
  for (auto it = first; it != m.end() && it->first < a + n; ++it) {
    Cell& c = it->second;
    if (write) {
      c.last_write = now;
      c.reads.clear();
      continue;
    }
    bool seen = false;
    for (Access& rd : c.reads)
      if (rd.rank == by) {
        rd.time = now.time;
        seen = true;
      }
    if (!seen) c.reads.push_back(now);
  }
  return true;
}

bool Hazards::release(int owner, const std::vector<int64_t>& vc, Access* prior, int64_t* pos) const {
  for (const auto& [start, c] : cells_[owner]) {
    *pos = start;
    if (!ordered(c.last_write, owner, vc)) {
      *prior = c.last_write;
      return false;
    }
    for (const Access& rd : c.reads)
      if (!ordered(rd, owner, vc)) {
        *prior = rd;
        return false;
      }
  }
  return true;
}

}  // namespace verify
}  // namespace commlib
