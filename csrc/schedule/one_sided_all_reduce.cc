// all_reduce over buffers every peer has mapped (one-sided, one_sided.h's protocol):
//   mapped_one_shot  every rank reads every peer's whole input at once (one step) into scratch,
//                    then, once every peer finished reading its input (in place, its output), sums
//                    all in rank order 0..P-1: one round trip, (P-1)*count read per rank;
//   mapped_two_shot  rank r reduces block r of everyone's input in place, reading one peer per
//                    step (block b summed in the order b, b+1, ...), into its output block, then
//                    reads every other block from its owner's output: 2(P-1)/P*count read per rank,
//                    no scratch, and every block's bits come from one rank;
//   mapped_fused_two_shot  rank r owns block r: once every peer is in the call it reads block r of
//                    every rank's input once, sums it in rank order 0..P-1 (in registers on the
//                    kernel path) and stores the sum into block r of every rank's output
//                    (reduce_to_all): N read and N written per rank, against (5P-3)/P x N for
//                    mapped_two_shot (its accumulator's round trips through memory and its gather
//                    step). Its kTagResult says "I am done with your buffers" (read your input
//                    block r, wrote your output block r); a rank returns once every peer's came.
#include "schedule/one_sided.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {

Schedule all_reduce_mapped_one_shot(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  const Region in = in_region(0, n), out = out_region(0, n);
  if (P == 1) return single_rank_copy(out, in);
  Step ready;
  add_to_peers(ready, r, P, op_signal, kTagReady);
  s.steps.push_back(std::move(ready));
  std::vector<Region> srcs(P);
  Step gather;
  add_to_peers(gather, r, P, op_wait, kTagReady);
  for (int j = 0; j < P; ++j) {
    if (j == r) {
      srcs[j] = in;
      continue;
    }
    srcs[j] = scratch_region((j < r ? j : j - 1) * n, n);
    gather.ops.push_back(op_get(j, srcs[j], in));
    gather.ops.push_back(op_signal(j, kTagDone));
  }
  s.steps.push_back(std::move(gather));
  s.scratch_count = (P - 1) * n;
  // In place the output is every peer's source: nothing writes it before all have read it.
  const size_t first = s.steps.size();
  append_ordered_reduce(s, out, srcs, r);
  add_to_peers(s.steps[first], r, P, op_wait, kTagDone);
  return s;
}

Schedule all_reduce_mapped_two_shot(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  auto block = [&](BufferId b, int q) { return Region{b, blk_off(n, P, q), blk_len(n, P, q)}; };
  if (P == 1) return single_rank_copy(out_region(0, n), in_region(0, n));
  Step ready;
  add_to_peers(ready, r, P, op_signal, kTagReady);
  s.steps.push_back(std::move(ready));
  // In place output block r is input block r, which only this rank reads.
  append_rotated_get_reduce(s, r, P, block(BufferId::Output, r), block(BufferId::Input, r), -1);
  // kTagResult from the last reducing step: the block is complete (and every peer's input read).
  add_to_peers(s.steps.back(), r, P, op_signal, kTagResult);
  // In place, output block q is input block q, which rank q read before its kTagResult.
  Step gather;
  add_to_peers(gather, r, P, op_wait, kTagResult);
  for (int q = 0; q < P; ++q) {
    if (q == r) continue;
    gather.ops.push_back(op_get(q, block(BufferId::Output, q), block(BufferId::Output, q)));
    gather.ops.push_back(op_signal(q, kTagDone));
  }
  s.steps.push_back(std::move(gather));
  Step release;  // nobody reads my output block any more
  add_to_peers(release, r, P, op_wait, kTagDone);
  s.steps.push_back(std::move(release));
  return s;
}

Schedule all_reduce_mapped_fused_two_shot(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  if (P == 1) return single_rank_copy(out_region(0, n), in_region(0, n));
  // In place output block r is input block r of every rank, which only this rank touches: it
  // reads an element of every rank before it stores that element anywhere. kTagResult: "my stores
  // into your output and my reads of your input are done".
  append_fused(s, r, P,
               op_reduce_to_all(out_region(blk_off(n, P, r), blk_len(n, P, r)), in_region(blk_off(n, P, r), blk_len(n, P, r))),
               kTagResult);
  return s;
}

}  // namespace

COMMLIB_REGISTER_ALGORITHM(AllReduce, "mapped_one_shot", all_reduce_mapped_one_shot, 50, kSmallMessages | kOneSided,
                           "one-sided: every rank reads all peers' inputs at once and sums them in rank order");
COMMLIB_REGISTER_ALGORITHM(AllReduce, "mapped_two_shot", all_reduce_mapped_two_shot, 51, kLargeMessages | kOneSided,
                           "one-sided: rank r sums block r of all inputs in place, then all read every block");
COMMLIB_REGISTER_ALGORITHM(AllReduce, "mapped_fused_two_shot", all_reduce_mapped_fused_two_shot, 52,
                           kLargeMessages | kOneSided,
                           "one-sided: rank r reads block r of all inputs once and stores their sum into every output");

}  // namespace sched
}  // namespace commlib
