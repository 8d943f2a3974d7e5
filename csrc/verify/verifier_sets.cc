// Interned rank-interval sets (verifier_sets.h).
#include "verify/verifier_sets.h"

#include <algorithm>

namespace commlib {
namespace verify {

namespace {
uint64_t hash_pairs(const std::vector<int32_t>& p) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int32_t v : p) h = (h ^ static_cast<uint32_t>(v)) * 0x100000001b3ULL;
  return h;
}
}  // namespace

RankSets::RankSets(int size) {
  off_.push_back(0);
  intern({});  // id 0: the empty set
  singles_.resize(size);
  for (int r = 0; r < size; ++r) singles_[r] = intern({r, r + 1});
  all_ = size > 0 ? intern({0, size}) : kEmpty;
}

RankSets::Id RankSets::intern(const std::vector<int32_t>& pairs) {
  const uint64_t h = hash_pairs(pairs);
  const Id head = by_hash_.get(h);  // kAbsent == kNone
  for (Id id = head; id != kNone; id = same_hash_[id])
    if (static_cast<size_t>(end(id) - begin(id)) == pairs.size() && std::equal(pairs.begin(), pairs.end(), begin(id)))
      return id;
  const Id id = static_cast<Id>(off_.size() - 1);
  data_.insert(data_.end(), pairs.begin(), pairs.end());
  off_.push_back(static_cast<uint32_t>(data_.size()));
  same_hash_.push_back(head);
  by_hash_.put(h, id);
  return id;
}

RankSets::Id RankSets::unite(Id a, Id b) {
  if (a == b || b == kEmpty) return a;
  if (a == kEmpty) return b;
  if (a > b) std::swap(a, b);
  const uint64_t key = (static_cast<uint64_t>(a) << 32) | b;
  const Id cached = union_cache_.get(key);
  if (cached != FlatMap::kAbsent) return cached;
  // Merge the two interval lists, coalescing overlapping or touching intervals.
  tmp_.clear();
  const int32_t *x = begin(a), *xe = end(a), *y = begin(b), *ye = end(b);
  while (x < xe || y < ye) {
    const int32_t* next;
    if (y >= ye || (x < xe && x[0] <= y[0])) {
      next = x;
      x += 2;
    } else {
      next = y;
      y += 2;
    }
    if (!tmp_.empty() && next[0] <= tmp_.back()) tmp_.back() = std::max(tmp_.back(), next[1]);
    else {
      tmp_.push_back(next[0]);
      tmp_.push_back(next[1]);
    }
  }
  const Id u = intern(tmp_);
  union_cache_.put(key, u);
  return u;
}

RankSets::Id RankSets::intersect(Id a, Id b) {
  std::vector<int32_t> out;
  const int32_t *x = begin(a), *xe = end(a), *y = begin(b), *ye = end(b);
  while (x < xe && y < ye) {
    const int32_t lo = std::max(x[0], y[0]), hi = std::min(x[1], y[1]);
    if (lo < hi) {
      out.push_back(lo);
      out.push_back(hi);
    }
    if (x[1] < y[1]) x += 2;
    else y += 2;
  }
  return intern(out);
}

bool RankSets::disjoint(Id a, Id b) const {
  if (a == kEmpty || b == kEmpty) return true;
  if (a == b) return false;
  const int32_t *x = begin(a), *xe = end(a), *y = begin(b), *ye = end(b);
  while (x < xe && y < ye) {
    if (std::max(x[0], y[0]) < std::min(x[1], y[1])) return false;
    if (x[1] < y[1]) x += 2;
    else y += 2;
  }
  return true;
}

int64_t RankSets::count(Id a) const {
  int64_t n = 0;
  for (const int32_t* p = begin(a); p < end(a); p += 2) n += p[1] - p[0];
  return n;
}

int RankSets::first(Id a) const { return begin(a) < end(a) ? begin(a)[0] : -1; }

std::string RankSets::str(Id a) const {
  std::string s = "{";
  for (const int32_t* p = begin(a); p < end(a); p += 2) {
    if (p != begin(a)) s += ",";
    const int lo = p[0], last = p[1] - 1;
    s += std::to_string(lo);
    if (last > lo + 1) s += ".." + std::to_string(last);
    else if (last == lo + 1) s += "," + std::to_string(last);
  }
  return s + "}";
}

}  // namespace verify
}  // namespace commlib
