// all_reduce by recursive doubling (butterfly) and Rabenseifner (recursive-halving reduce-scatter +
// recursive-doubling all-gather). Non-power-of-two P: the fold of Thakur, Rabenseifner & Gropp
// (2005): with p2 = pow2_floor(P), rem = P - p2, each even rank r < 2*rem sends its whole input to
// r+1 (which reduces it in) and sits out; the remaining p2 ranks run the power-of-two algorithm and
// the odd ranks finally send the result back to r-1.
// Determinism: in the butterfly both partners combine the same two values (a op b vs b op a,
// identical for commutative IEEE ops), so every rank holds the same bits after every round; in
// Rabenseifner each block is finished on exactly one rank and copied to the others.
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {
// Shared prologue of both: returns false for folded-out ranks (their schedule is complete).
bool fold_in(Schedule& s, const Fold& f, int r, int64_t n) {
  const Region in = in_region(0, n), out = out_region(0, n);
  if (f.newrank(r) < 0) {
    s.steps.push_back(Step{{op_send(r + 1, in)}});
    s.steps.push_back(Step{{op_recv(r + 1, out)}});
    return false;
  }
  s.steps.push_back(Step{{op_copy(out, in)}});
  if (r < 2 * f.rem) s.steps.push_back(Step{{op_recv_reduce(r - 1, out)}});
  return true;
}
void fold_out(Schedule& s, const Fold& f, int r, int64_t n) {
  if (r < 2 * f.rem) s.steps.push_back(Step{{op_send(r - 1, out_region(0, n))}});
}
}  // namespace

Schedule all_reduce_recursive_doubling(const CollArgs& a) {
  const int r = a.rank;
  const int64_t n = a.count;
  const Fold f(a.size);
  Schedule s;
  if (!fold_in(s, f, r, n)) return s;
  const int nr = f.newrank(r);
  const Region out = out_region(0, n), tmp = scratch_region(0, n);
  for (int mask = 1; mask < f.p2; mask <<= 1) {
    const int partner = f.real(nr ^ mask);
    s.steps.push_back(Step{{op_send(partner, out), op_recv(partner, tmp)}});
    s.steps.push_back(Step{{op_reduce(out, tmp)}});
  }
  if (f.p2 > 1) s.scratch_count = n;
  fold_out(s, f, r, n);
  return s;
}

Schedule all_reduce_rabenseifner(const CollArgs& a) {
  const int r = a.rank;
  const int64_t n = a.count;
  const Fold f(a.size);
  Schedule s;
  // No input->output copy out of place: the rank that received a folded-out partner's vector
  // reduces it straight from its input into its output; the others read their input in the first
  // halving step (send one half from it, reduce the other half from it into the output).
  if (f.newrank(r) < 0) {
    s.steps.push_back(Step{{op_send(r + 1, in_region(0, n))}});
    s.steps.push_back(Step{{op_recv(r + 1, out_region(0, n))}});
    return s;
  }
  bool output_holds_data = true;
  if (r < 2 * f.rem)
    s.steps.push_back(Step{{op_recv_reduce_from(r - 1, out_region(0, n), in_region(0, n))}});
  else if (f.p2 == 1)
    s.steps.push_back(Step{{op_copy(out_region(0, n), in_region(0, n))}});
  else
    output_holds_data = false;
  const int nr = f.newrank(r), p2 = f.p2;
  // Blocks of the p2-way split, indexed by new rank.
  auto range_in = [&](BufferId b, int lo, int hi) {
    const int64_t o = blk_off(n, p2, lo);
    return Region{b, o, blk_off(n, p2, hi) - o};
  };
  auto range = [&](int lo, int hi) { return range_in(BufferId::Output, lo, hi); };
  int lo = 0, hi = p2;
  for (int mask = p2 / 2; mask >= 1; mask >>= 1) {  // recursive halving reduce-scatter
    const int partner = f.real(nr ^ mask), mid = lo + mask;
    const int keep_lo = (nr & mask) ? mid : lo, keep_hi = (nr & mask) ? hi : mid;
    const int give_lo = (nr & mask) ? lo : mid, give_hi = (nr & mask) ? mid : hi;
    if (output_holds_data) {
      s.steps.push_back(Step{{op_send(partner, range(give_lo, give_hi)),
                              op_recv_reduce(partner, range(keep_lo, keep_hi))}});
    } else {
      s.steps.push_back(Step{{op_send(partner, range_in(BufferId::Input, give_lo, give_hi)),
                              op_recv_reduce_from(partner, range(keep_lo, keep_hi),
                                                  range_in(BufferId::Input, keep_lo, keep_hi))}});
      output_holds_data = true;
    }
    lo = keep_lo;
    hi = keep_hi;
  }
  for (int mask = 1; mask < p2; mask <<= 1) {  // recursive doubling all-gather
    const int partner = f.real(nr ^ mask), plo = lo ^ mask;
    s.steps.push_back(Step{{op_send(partner, range(lo, lo + mask)), op_recv(partner, range(plo, plo + mask))}});
    lo = std::min(lo, plo);
  }
  fold_out(s, f, r, n);
  return s;
}

COMMLIB_REGISTER_ALGORITHM(AllReduce, "recursive_doubling", all_reduce_recursive_doubling, 2, kSmallMessages | kPowerOfTwo,
                           "butterfly: log P exchanges of the whole vector");
COMMLIB_REGISTER_ALGORITHM(AllReduce, "rabenseifner", all_reduce_rabenseifner, 3, kLargeMessages | kPowerOfTwo,
                           "recursive-halving reduce-scatter then recursive-doubling all-gather");

}  // namespace sched
}  // namespace commlib
