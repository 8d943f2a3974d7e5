// all_reduce in one or two communication rounds through scratch, reducing in rank order 0..P-1 so
// every rank computes the identical left-to-right sum:
//   direct           every rank receives every peer's whole input ((P-1)*count scratch);
//   two_shot         direct reduce-scatter (rank r gathers block r from all) + direct all-gather;
//   reduce_broadcast everyone sends to rank 0, which reduces and sends the result to everyone
//                    (the parameter-server pattern; O(P*count) traffic at one rank).
#include "schedule/builders.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

Schedule all_reduce_direct(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  const Region in = in_region(0, n), out = out_region(0, n);
  if (P == 1) return single_rank_copy(out, in);
  std::vector<Region> srcs(P);
  Step x;
  x.ops.reserve(2 * (P - 1));
  for (int j = 0; j < P; ++j) {
    if (j == r) {
      srcs[j] = in;
      continue;
    }
    srcs[j] = scratch_region((j < r ? j : j - 1) * n, n);
    x.ops.push_back(op_send(j, in));
    x.ops.push_back(op_recv(j, srcs[j]));
  }
  s.steps.push_back(std::move(x));
  append_ordered_reduce(s, out, srcs, r);
  s.scratch_count = (P - 1) * n;
  return s;
}

Schedule all_reduce_two_shot(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  if (P == 1) return single_rank_copy(out_region(0, n), in_region(0, n));
  const int64_t mine = blk_len(n, P, r);
  std::vector<Region> srcs(P);
  Step x;
  x.ops.reserve(2 * (P - 1));
  for (int j = 0; j < P; ++j) {
    if (j == r) {
      srcs[j] = in_region(blk_off(n, P, r), mine);
      continue;
    }
    srcs[j] = scratch_region((j < r ? j : j - 1) * mine, mine);
    x.ops.push_back(op_send(j, in_region(blk_off(n, P, j), blk_len(n, P, j))));
    x.ops.push_back(op_recv(j, srcs[j]));
  }
  s.steps.push_back(std::move(x));
  const Region my_out = out_region(blk_off(n, P, r), mine);
  append_ordered_reduce(s, my_out, srcs, r);
  Step g;
  g.ops.reserve(2 * (P - 1));
  for (int j = 0; j < P; ++j) {
    if (j == r) continue;
    g.ops.push_back(op_send(j, my_out));
    g.ops.push_back(op_recv(j, out_region(blk_off(n, P, j), blk_len(n, P, j))));
  }
  s.steps.push_back(std::move(g));
  s.scratch_count = (P - 1) * mine;
  return s;
}

Schedule all_reduce_reduce_broadcast(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  const Region in = in_region(0, n), out = out_region(0, n);
  if (P == 1) return single_rank_copy(out, in);
  if (r != 0) {
    s.steps.push_back(Step{{op_send(0, in)}});
    s.steps.push_back(Step{{op_recv(0, out)}});
    return s;
  }
  std::vector<Region> srcs(P);
  srcs[0] = in;
  Step x;
  for (int j = 1; j < P; ++j) {
    srcs[j] = scratch_region((j - 1) * n, n);
    x.ops.push_back(op_recv(j, srcs[j]));
  }
  s.steps.push_back(std::move(x));
  append_ordered_reduce(s, out, srcs, 0);
  Step b;
  for (int j = 1; j < P; ++j) b.ops.push_back(op_send(j, out));
  s.steps.push_back(std::move(b));
  s.scratch_count = (P - 1) * n;
  return s;
}

COMMLIB_REGISTER_ALGORITHM(AllReduce, "direct", all_reduce_direct, 4, kSmallMessages,
                           "one shot: every rank reduces every peer's whole input");
COMMLIB_REGISTER_ALGORITHM(AllReduce, "two_shot", all_reduce_two_shot, 5, kLargeMessages,
                           "direct reduce-scatter then direct all-gather");
COMMLIB_REGISTER_ALGORITHM(AllReduce, "reduce_broadcast", all_reduce_reduce_broadcast, 7, kNoTraits,
                           "reduce to rank 0, then broadcast (the parameter-server pattern)");

}  // namespace sched
}  // namespace commlib
