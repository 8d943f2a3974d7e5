// Symbolic values of the verifier (verifier.h) and the run-length-encoded memory that holds them.
// An element is (source index, contributor set, reduction-tree fingerprint); rank r's input element
// i starts as (i, {r}, leaf(r)). A reduction needs equal source indices and disjoint sets.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "verify/verifier_sets.h"

namespace commlib {
namespace verify {

using SetId = RankSets::Id;

// Val.src >= 0: a valid element; otherwise one of these.
constexpr int64_t kUninit = -1;
constexpr int64_t kMixed = -2;         // reduced two different source elements together
constexpr int64_t kDouble = -3;        // a contributor counted twice (set = the repeated ones)
constexpr int64_t kReduceUninit = -4;  // reduced with uninitialised data

// `tree` fingerprints the shape of the reduction that produced a valid value, up to
// commutativity (a op b == b op a bitwise for IEEE add/mul, min, max): leaves are ranks, and a
// combine hashes the unordered pair of its operands. Two ranks holding the same element with
// different trees would not be bitwise identical for floats.
struct Val {
  int64_t src;
  SetId set;
  uint64_t tree = 0;
};

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
inline uint64_t leaf_tree(int rank) { return mix64(0x1000 + static_cast<uint64_t>(rank)); }

// a (op) b, symbolically.
Val combine(RankSets& sets, Val a, Val b);

// Memory is run-length encoded: a run [start, start+len) of valid values holds source indices
// src, src+1, ... with one contributor set (or one special value), so the cost of a schedule is
// proportional to its number of ops and runs, not to `count`.
struct Run {
  int64_t start, len, src;
  SetId set;
  uint64_t tree;
};
inline int64_t src_at(const Run& r, int64_t pos) { return r.src >= 0 ? r.src + (pos - r.start) : r.src; }
void push_merge(std::vector<Run>& v, const Run& r);

// One rank's arena. Pieces are relative runs (start 0..n) covering [0, n) exactly.
class Mem {
 public:
  void init(int64_t arena);
  void read(int64_t a, int64_t n, std::vector<Run>& out) const;
  void write(int64_t a, int64_t n, const std::vector<Run>& pieces);
  void set(int64_t a, int64_t n, int64_t src, SetId set, uint64_t tree);

 private:
  size_t find(int64_t pos) const;  // index of the run containing pos
  std::vector<Run> runs_, rep_;
};

// out = a (op) b elementwise; a and b are pieces of the same length.
// Walks two run lists over the same elements in step: f(x, y, pos, end) for every piece
// [pos, end) that lies in one run x of `a` and one run y of `b`.
template <class F>
void for_each_overlap(const std::vector<Run>& a, const std::vector<Run>& b, F&& f) {
  size_t i = 0, j = 0;
  int64_t pos = 0;
  while (i < a.size() && j < b.size()) {
    const Run& x = a[i];
    const Run& y = b[j];
    const int64_t end = std::min(x.start + x.len, y.start + y.len);
    f(x, y, pos, end);
    pos = end;
    if (x.start + x.len == end) ++i;
    if (y.start + y.len == end) ++j;
  }
}

void combine_pieces(RankSets& sets, const std::vector<Run>& a, const std::vector<Run>& b, std::vector<Run>& out);

// "input[3] of rank 2", "reduction over ranks {0..7} of input[3]", "uninitialised (...)".
std::string val_str(const RankSets& sets, Val v, const char* in_name);

}  // namespace verify
}  // namespace commlib
