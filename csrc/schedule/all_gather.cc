// all_gather (output block j = rank j's input, count elements each):
//   ring               P-1 steps; in step k rank r forwards block r-k to r+1.
//   recursive_doubling butterfly over contiguous block ranges; non-power-of-two P uses the fold
//                      (builders.h): even r < 2*rem hands its block to r+1 first and receives the
//                      whole output from r+1 at the end. New rank nr stands for the contiguous
//                      original ranks [first(nr), first(nr+1)), so every exchange is one region.
//   bruck              ceil(log2 P) steps on a rotated copy in scratch (tmp[i] = block r+i): step
//                      with distance d sends tmp[0, min(d, P-d)) to r-d and receives tmp[d, ...)
//                      from r+d; a final rotation copies tmp into place. Any P.
//   direct             one step: every rank sends its input to every peer.
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

Schedule all_gather_ring(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  auto blk = [&](int b) { return out_region(pmod(b, P) * n, n); };
  const Region in = in_region(0, n);
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(blk(r), in)}});
    return s;
  }
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  s.steps.reserve(P - 1);
  s.steps.push_back(Step{{op_send(next, in), op_recv(prev, blk(r - 1)), op_copy(blk(r), in)}});
  for (int k = 1; k < P - 1; ++k)
    s.steps.push_back(Step{{op_send(next, blk(r - k)), op_recv(prev, blk(r - k - 1))}});
  return s;
}

Schedule all_gather_recursive_doubling(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  const Fold f(P);
  Schedule s;
  const Region in = in_region(0, n), all = out_region(0, P * n);
  if (f.newrank(r) < 0) {
    s.steps.push_back(Step{{op_send(r + 1, in)}});
    s.steps.push_back(Step{{op_recv(r + 1, all)}});
    return s;
  }
  const int nr = f.newrank(r);
  auto range = [&](int nlo, int nhi) {
    const int64_t o = static_cast<int64_t>(f.first(nlo)) * n;
    return out_region(o, static_cast<int64_t>(f.first(nhi)) * n - o);
  };
  Step first{{op_copy(out_region(r * n, n), in)}};
  if (r < 2 * f.rem) first.ops.push_back(op_recv(r - 1, out_region((r - 1) * n, n)));
  s.steps.push_back(std::move(first));
  for (int mask = 1; mask < f.p2; mask <<= 1) {
    const int partner = f.real(nr ^ mask);
    const int lo = nr & ~(mask - 1), plo = lo ^ mask;
    s.steps.push_back(Step{{op_send(partner, range(lo, lo + mask)), op_recv(partner, range(plo, plo + mask))}});
  }
  if (r < 2 * f.rem) s.steps.push_back(Step{{op_send(r - 1, all)}});
  return s;
}

Schedule all_gather_bruck(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  const Region in = in_region(0, n);
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out_region(0, n), in)}});
    return s;
  }
  s.steps.push_back(Step{{op_copy(scratch_region(0, n), in)}});
  for (int d = 1; d < P; d <<= 1) {
    const int64_t m = std::min(d, P - d) * n;
    s.steps.push_back(Step{{op_send(pmod(r - d, P), scratch_region(0, m)),
                            op_recv(pmod(r + d, P), scratch_region(d * n, m))}});
  }
  // tmp[i] = block (r + i) mod P.
  Step rot{{op_copy(out_region(r * n, (P - r) * n), scratch_region(0, (P - r) * n))}};
  if (r > 0) rot.ops.push_back(op_copy(out_region(0, r * n), scratch_region((P - r) * n, r * n)));
  s.steps.push_back(std::move(rot));
  s.scratch_count = P * n;
  return s;
}

Schedule all_gather_direct(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  const Region in = in_region(0, n);
  Step x;
  x.ops.reserve(2 * P - 1);
  x.ops.push_back(op_copy(out_region(r * n, n), in));
  // Sends first, peers in rotated order, as all_to_all's direct (all_to_all.cc says why): every
  // peer may read this rank's input before this rank reads anyone's, one reader per input at a time.
  for (int k = 1; k < P; ++k) x.ops.push_back(op_send((r + k) % P, in));
  for (int k = 1; k < P; ++k) {
    const int from = pmod(r - k, P);
    x.ops.push_back(op_recv(from, out_region(from * n, n)));
  }
  s.steps.push_back(std::move(x));
  return s;
}

COMMLIB_REGISTER_ALGORITHM(AllGather, "ring", all_gather_ring, 1, kLargeMessages,
                           "P-1 steps around a ring");
COMMLIB_REGISTER_ALGORITHM(AllGather, "recursive_doubling", all_gather_recursive_doubling, 2, kSmallMessages | kPowerOfTwo,
                           "log P exchanges of doubling size");
COMMLIB_REGISTER_ALGORITHM(AllGather, "bruck", all_gather_bruck, 3, kSmallMessages,
                           "log P steps for any P, then a local rotation");
COMMLIB_REGISTER_ALGORITHM(AllGather, "direct", all_gather_direct, 4, kSmallMessages,
                           "one step: every rank sends its block to every peer");

}  // namespace sched
}  // namespace commlib
