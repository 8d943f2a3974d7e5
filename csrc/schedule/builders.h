// Builders of every registered algorithm and the helpers they share. Internal to csrc/schedule
// (each builder file registers its builders with COMMLIB_REGISTER_ALGORITHM, registry.h); see ir.h for buffers, counts, aliasing and the rules.
//
// Conventions used by every builder here:
//   * Blocks: a count-element vector split into p blocks gives block b count/p elements plus one
//     for the first count%p blocks (blk_off/blk_len), so uneven counts and count < p just work.
//   * Non-power-of-two world sizes use the standard fold (Fold below): with p2 the largest power
//     of two <= P and rem = P - p2, even ranks r < 2*rem hand their data to r+1 first and get the
//     result back at the end; the other p2 ranks run the power-of-two algorithm.
//   * A copy whose src and dst are the same memory (in-place calls) is a no-op: the executor skips
//     it and the verifier does not count it as a write.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "schedule/ir.h"

namespace commlib {
namespace sched {

inline int64_t blk_off(int64_t n, int p, int b) {
  const int64_t q = n / p, rm = n % p;
  return b * q + std::min<int64_t>(b, rm);
}
inline int64_t blk_len(int64_t n, int p, int b) { return n / p + (b < n % p ? 1 : 0); }
inline int pmod(int a, int p) { return ((a % p) + p) % p; }
inline int pow2_floor(int p) {
  int v = 1;
  while (v * 2 <= p) v *= 2;
  return v;
}
inline int ceil_log2(int p) {
  int k = 0;
  while ((1 << k) < p) ++k;
  return k;
}
inline bool is_pow2(int p) { return p > 0 && (p & (p - 1)) == 0; }
inline Region with_buf(BufferId b, int64_t off, int64_t n) { return Region{b, off, n}; }
// The whole schedule of a one-rank call whose output is its own input: one local copy (a no-op
// in place). What every builder whose P == 1 case is that copy returns.
inline Schedule single_rank_copy(Region out, Region own) {
  Schedule s;
  s.steps.push_back(Step{{op_copy(out, own)}});
  return s;
}

// Fold of P ranks onto p2 = pow2_floor(P) "new ranks".
struct Fold {
  int P, p2, rem;
  explicit Fold(int size) : P(size), p2(pow2_floor(size)), rem(size - pow2_floor(size)) {}
  // Folded-out ranks (even r < 2*rem) return -1.
  int newrank(int r) const {
    if (r < 2 * rem) return (r % 2 == 0) ? -1 : r / 2;
    return r - rem;
  }
  int real(int nr) const { return nr < rem ? 2 * nr + 1 : nr + rem; }
  // The original ranks held by new ranks [0, nr) form [0, first(nr)): new rank nr stands for the
  // contiguous original ranks [first(nr), first(nr+1)).
  int first(int nr) const { return nr < rem ? 2 * nr : nr + rem; }
};

// Append steps computing dst = srcs[0] op srcs[1] op ... op srcs[P-1] (left to right, so every
// rank computing it gets the same bits). srcs[own] is this rank's input (it may alias dst); every
// other src must be scratch this rank may overwrite.
void append_ordered_reduce(Schedule& s, Region dst, const std::vector<Region>& srcs, int own);

// Binomial-tree helpers in relative rank space (vr = (rank - root) mod P).
// Parent mask: lowest set bit of vr (0 for the root); subtree of vr is [vr, vr + subtree_size).
inline int lowbit(int v) { return v & -v; }
inline int subtree_size(int vr, int P) {
  if (vr == 0) return P;
  return std::min(lowbit(vr), P - vr);
}

Schedule all_reduce_ring(const CollArgs& a);
Schedule all_reduce_recursive_doubling(const CollArgs& a);
Schedule all_reduce_rabenseifner(const CollArgs& a);
Schedule all_reduce_direct(const CollArgs& a);
Schedule all_reduce_two_shot(const CollArgs& a);
Schedule all_reduce_tree(const CollArgs& a);
Schedule all_reduce_reduce_broadcast(const CollArgs& a);
Schedule all_reduce_hierarchical(const CollArgs& a);  // hierarchical.cc, as are the next three

Schedule all_gather_ring(const CollArgs& a);
Schedule all_gather_recursive_doubling(const CollArgs& a);
Schedule all_gather_bruck(const CollArgs& a);
Schedule all_gather_direct(const CollArgs& a);
Schedule all_gather_hierarchical(const CollArgs& a);

Schedule reduce_scatter_ring(const CollArgs& a);
Schedule reduce_scatter_recursive_halving(const CollArgs& a);
Schedule reduce_scatter_direct(const CollArgs& a);
Schedule reduce_scatter_hierarchical(const CollArgs& a);

Schedule all_to_all_pairwise(const CollArgs& a);
Schedule all_to_all_bruck(const CollArgs& a);
Schedule all_to_all_direct(const CollArgs& a);

Schedule broadcast_binomial(const CollArgs& a);
Schedule broadcast_scatter_allgather(const CollArgs& a);
Schedule broadcast_pipeline(const CollArgs& a);
Schedule broadcast_direct(const CollArgs& a);
Schedule broadcast_hierarchical(const CollArgs& a);

Schedule reduce_binomial(const CollArgs& a);
Schedule reduce_direct(const CollArgs& a);

Schedule gather_binomial(const CollArgs& a);
Schedule gather_linear(const CollArgs& a);
Schedule scatter_binomial(const CollArgs& a);
Schedule scatter_linear(const CollArgs& a);

Schedule barrier_dissemination(const CollArgs& a);
Schedule barrier_linear(const CollArgs& a);

// Pieces shared between collectives.
// Binomial reduce of `count` elements to `root`, accumulating in `acc` (a region of output or
// scratch the rank owns; the root passes its output). `own` is the rank's input.
void append_binomial_reduce(Schedule& s, int rank, int size, int root, int64_t count, Region acc,
                            bool acc_is_output);
// Binomial broadcast from root of `buf` (on every rank, same offsets); the root sends from `src`.
void append_binomial_bcast(Schedule& s, int rank, int size, int root, Region src, Region buf);

}  // namespace sched
}  // namespace commlib
