// reduce_scatter (input: P blocks of count; rank r ends with block r reduced over all ranks):
//   ring              P-1 steps: in step k rank r passes its partial of block r-k-1 to r+1 and
//                     receives the partial of block r-k-2 from r-1, reduced with its own input
//                     block as it arrives (recv_reduce from the input) into alternating scratch
//                     buffers; the last step reduces straight into the output.
//   recursive_halving halve the block range with partner nr^mask (mask = p2/2 .. 1), reducing the
//                     kept half into a P*count scratch accumulator, as it arrives (recv_reduce; the
//                     first step from the input). Non-power-of-two P: fold
//                     (builders.h): even r < 2*rem sends its whole input to r+1, which reduces it
//                     in, represents both ranks' blocks and finally sends block r back.
//   direct            one step: rank r receives block r from every peer into scratch, then reduces
//                     in rank order 0..P-1.
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

Schedule reduce_scatter_ring(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  auto in = [&](int b) { return in_region(pmod(b, P) * n, n); };
  const Region out = out_region(0, n);
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out, in(0))}});
    return s;
  }
  const int next = (r + 1) % P, prev = (r + P - 1) % P;
  const Region buf[2] = {scratch_region(0, n), scratch_region(n, n)};
  for (int k = 0; k < P - 1; ++k) {
    const Region src = k == 0 ? in(r - 1) : buf[(k - 1) % 2];
    // Each partial is reduced with the rank's own block as it arrives (recv_reduce from the input),
    // so the reduction overlaps the transfer instead of following it.
    s.steps.push_back(Step{{op_send(next, src), op_recv_reduce_from(prev, k == P - 2 ? out : buf[k % 2], in(r - k - 2))}});
  }
  if (P > 2) s.scratch_count = 2 * n;
  return s;
}

Schedule reduce_scatter_recursive_halving(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  const Fold f(P);
  Schedule s;
  const Region all_in = in_region(0, P * n), out = out_region(0, n);
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out, in_region(0, n))}});
    return s;
  }
  if (f.newrank(r) < 0) {
    s.steps.push_back(Step{{op_send(r + 1, all_in)}});
    s.steps.push_back(Step{{op_recv(r + 1, out)}});
    return s;
  }
  const int nr = f.newrank(r);
  // The accumulator lives in scratch at the input's offsets.
  auto rng = [&](BufferId b, int nlo, int nhi) {
    const int64_t o = static_cast<int64_t>(f.first(nlo)) * n;
    return Region{b, o, static_cast<int64_t>(f.first(nhi)) * n - o};
  };
  bool init = false;
  if (r < 2 * f.rem) {
    s.steps.push_back(Step{{op_recv(r - 1, scratch_region(0, P * n))}});
    s.steps.push_back(Step{{op_reduce(scratch_region(0, P * n), all_in)}});
    init = true;
  }
  int lo = 0, hi = f.p2;
  for (int mask = f.p2 / 2; mask >= 1; mask >>= 1) {
    const int partner = f.real(nr ^ mask), mid = lo + mask;
    int klo = lo, khi = mid, slo = mid, shi = hi;
    if (nr & mask) klo = mid, khi = hi, slo = lo, shi = mid;
    if (init) {
      s.steps.push_back(Step{{op_send(partner, rng(BufferId::Scratch, slo, shi)),
                              op_recv_reduce(partner, rng(BufferId::Scratch, klo, khi))}});
    } else {
      s.steps.push_back(Step{{op_send(partner, rng(BufferId::Input, slo, shi)),
                              op_recv_reduce_from(partner, rng(BufferId::Scratch, klo, khi), rng(BufferId::Input, klo, khi))}});
      init = true;
    }
    lo = klo, hi = khi;
  }
  Step fin{{op_copy(out, scratch_region(r * n, n))}};
  if (r < 2 * f.rem) fin.ops.push_back(op_send(r - 1, scratch_region((r - 1) * n, n)));
  s.steps.push_back(std::move(fin));
  s.scratch_count = P * n;
  return s;
}

Schedule reduce_scatter_direct(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  const Region out = out_region(0, n);
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out, in_region(0, n))}});
    return s;
  }
  std::vector<Region> srcs(P);
  Step x;
  x.ops.reserve(2 * (P - 1));
  for (int j = 0; j < P; ++j) {
    if (j == r) {
      srcs[j] = in_region(r * n, n);
      continue;
    }
    srcs[j] = scratch_region((j < r ? j : j - 1) * n, n);
    x.ops.push_back(op_send(j, in_region(j * n, n)));
    x.ops.push_back(op_recv(j, srcs[j]));
  }
  s.steps.push_back(std::move(x));
  append_ordered_reduce(s, out, srcs, r);
  s.scratch_count = (P - 1) * n;
  return s;
}

COMMLIB_REGISTER_ALGORITHM(ReduceScatter, "ring", reduce_scatter_ring, 1, kLargeMessages,
                           "P-1 steps around a ring");
COMMLIB_REGISTER_ALGORITHM(ReduceScatter, "recursive_halving", reduce_scatter_recursive_halving, 2, kSmallMessages | kPowerOfTwo,
                           "log P exchanges of halving size");
COMMLIB_REGISTER_ALGORITHM(ReduceScatter, "direct", reduce_scatter_direct, 3, kSmallMessages,
                           "one step: every rank sends each peer its block");

}  // namespace sched
}  // namespace commlib
