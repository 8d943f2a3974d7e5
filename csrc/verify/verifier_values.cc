// Symbolic values and run-length-encoded memory (verifier_values.h).
#include "verify/verifier_values.h"

#include <algorithm>

namespace commlib {
namespace verify {

namespace {
inline uint64_t join_tree(uint64_t a, uint64_t b) {
  if (a > b) std::swap(a, b);
  return mix64(mix64(a) ^ (b * 0x2545f4914f6cdd1dULL));
}
inline bool mergeable(const Run& a, const Run& b) {
  if (a.set != b.set || a.tree != b.tree) return false;
  if (a.src < 0 || b.src < 0) return a.src == b.src;
  return b.src == a.src + a.len;
}
}  // namespace

Val combine(RankSets& sets, Val a, Val b) {
  if (a.src < 0 || b.src < 0) {
    if (a.src == kUninit || b.src == kUninit) return Val{kReduceUninit, sets.unite(a.set, b.set)};
    return a.src < 0 ? Val{a.src, a.set} : Val{b.src, b.set};
  }
  if (a.src != b.src) return Val{kMixed, sets.unite(a.set, b.set)};
  if (!sets.disjoint(a.set, b.set)) return Val{kDouble, sets.intersect(a.set, b.set)};
  return Val{a.src, sets.unite(a.set, b.set), join_tree(a.tree, b.tree)};
}

void push_merge(std::vector<Run>& v, const Run& r) {
  if (r.len <= 0) return;
  if (!v.empty() && mergeable(v.back(), r)) {
    v.back().len += r.len;
    return;
  }
  v.push_back(r);
}

void Mem::init(int64_t arena) {
  runs_.clear();
  if (arena > 0) runs_.push_back(Run{0, arena, kUninit, RankSets::kEmpty, 0});
}

void Mem::read(int64_t a, int64_t n, std::vector<Run>& out) const {
  out.clear();
  if (n <= 0) return;
  for (size_t i = find(a); i < runs_.size() && runs_[i].start < a + n; ++i) {
    const Run& r = runs_[i];
    const int64_t s = std::max(r.start, a), e = std::min(r.start + r.len, a + n);
    push_merge(out, Run{s - a, e - s, src_at(r, s), r.set, r.tree});
  }
}

void Mem::write(int64_t a, int64_t n, const std::vector<Run>& pieces) {
  if (n <= 0) return;
  const size_t i = find(a), j = find(a + n - 1);
  const Run ri = runs_[i], rj = runs_[j];
  rep_.clear();
  if (ri.start < a) rep_.push_back(Run{ri.start, a - ri.start, ri.src, ri.set, ri.tree});
  for (const Run& p : pieces) push_merge(rep_, Run{p.start + a, p.len, p.src, p.set, p.tree});
  const int64_t ej = rj.start + rj.len;
  if (ej > a + n) push_merge(rep_, Run{a + n, ej - (a + n), src_at(rj, a + n), rj.set, rj.tree});
  const size_t old = j - i + 1;
  if (rep_.size() <= old) {
    std::copy(rep_.begin(), rep_.end(), runs_.begin() + i);
    runs_.erase(runs_.begin() + i + rep_.size(), runs_.begin() + j + 1);
  } else {
    std::copy(rep_.begin(), rep_.begin() + old, runs_.begin() + i);
    runs_.insert(runs_.begin() + j + 1, rep_.begin() + old, rep_.end());
  }
}

void Mem::set(int64_t a, int64_t n, int64_t src, SetId set, uint64_t tree) {
  std::vector<Run> one{Run{0, n, src, set, tree}};
  write(a, n, one);
}

size_t Mem::find(int64_t pos) const {
  auto it = std::upper_bound(runs_.begin(), runs_.end(), pos, [](int64_t v, const Run& r) { return v < r.start; });
  return static_cast<size_t>(it - runs_.begin()) - 1;
}

void combine_pieces(RankSets& sets, const std::vector<Run>& a, const std::vector<Run>& b, std::vector<Run>& out) {
  out.clear();
  for_each_overlap(a, b, [&](const Run& x, const Run& y, int64_t pos, int64_t end) {
    const Val v = combine(sets, Val{src_at(x, pos), x.set, x.tree}, Val{src_at(y, pos), y.set, y.tree});
    push_merge(out, Run{pos, end - pos, v.src, v.set, v.tree});
  });
}

std::string val_str(const RankSets& sets, Val v, const char* in_name) {
  switch (v.src) {
    case kUninit: return "uninitialised (never written)";
    case kMixed: return "invalid (different elements reduced together, ranks " + sets.str(v.set) + ")";
    case kDouble: return "invalid (ranks " + sets.str(v.set) + " counted twice)";
    case kReduceUninit: return "invalid (reduced with uninitialised data)";
    default: break;
  }
  if (sets.count(v.set) == 1)
    return std::string(in_name) + "[" + std::to_string(v.src) + "] of rank " + std::to_string(sets.first(v.set));
  return "reduction over ranks " + sets.str(v.set) + " of " + in_name + "[" + std::to_string(v.src) + "]";
}

}  // namespace verify
}  // namespace commlib
