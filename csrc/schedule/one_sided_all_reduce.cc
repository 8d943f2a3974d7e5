// all_reduce over buffers every peer has mapped (one-sided, one_sided.h's protocol):
//   mapped_one_shot  every rank reads every peer's whole input and reduces it in rank order into
//                    scratch, then (once every peer finished reading its input, which in place is
//                    its output) copies the sum out: one round trip, (P-1)*count read per rank;
//   mapped_two_shot  rank r reduces block r of everyone's input in rank order into scratch, then
//                    every rank reads each reduced block from its owner's scratch: 2(P-1)/P*count
//                    read per rank, and every block's bits come from one rank.
#include "schedule/one_sided.h"
#include "schedule/registry.h"

namespace commlib {
namespace sched {

namespace {

Schedule all_reduce_mapped_one_shot(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out_region(0, n), in_region(0, n))}});
    return s;
  }
  // In place the output is every peer's source, so the sum waits in scratch until all have read.
  const Region acc = scratch_region(0, n);
  s.scratch_count = n;
  Step ready;
  add_to_peers(ready, r, P, op_signal, kTagReady);
  s.steps.push_back(std::move(ready));
  append_ordered_get_reduce(s, r, P, acc, [&](int) { return in_region(0, n); });
  Step out;
  add_to_peers(out, r, P, op_wait, kTagDone);
  out.ops.push_back(op_copy(out_region(0, n), acc));
  s.steps.push_back(std::move(out));
  return s;
}

Schedule all_reduce_mapped_two_shot(const CollArgs& a) {
  const int P = a.size, r = a.rank;
  const int64_t n = a.count;
  Schedule s;
  if (P == 1) {
    s.steps.push_back(Step{{op_copy(out_region(0, n), in_region(0, n))}});
    return s;
  }
  const int64_t mine = blk_len(n, P, r);
  // Every rank's reduced block sits at scratch[0:len] of its owner (read there by the peers).
  const Region acc = scratch_region(0, mine);
  s.scratch_count = blk_len(n, P, 0);
  Step ready;
  add_to_peers(ready, r, P, op_signal, kTagReady);
  s.steps.push_back(std::move(ready));
  append_ordered_get_reduce(s, r, P, acc, [&](int) { return in_region(blk_off(n, P, r), mine); });
  // kTagResult from the last reducing step: the block is complete (and every peer's input read).
  add_to_peers(s.steps.back(), r, P, op_signal, kTagResult);
  // In place, output block q is input block q, which rank q read before its kTagResult.
  Step gather;
  add_to_peers(gather, r, P, op_wait, kTagResult);
  for (int q = 0; q < P; ++q) {
    const Region dst = out_region(blk_off(n, P, q), blk_len(n, P, q));
    if (q == r) {
      gather.ops.push_back(op_copy(dst, acc));
    } else {
      gather.ops.push_back(op_get(q, dst, scratch_region(0, blk_len(n, P, q))));
      gather.ops.push_back(op_signal(q, kTagDone));
    }
  }
  s.steps.push_back(std::move(gather));
  // kTagDone from the reduce phase, then from the gather: nobody reads my buffers any more.
  Step release;
  add_to_peers(release, r, P, op_wait, kTagDone);
  add_to_peers(release, r, P, op_wait, kTagDone);
  s.steps.push_back(std::move(release));
  return s;
}

}  // namespace

COMMLIB_REGISTER_ALGORITHM(AllReduce, "mapped_one_shot", all_reduce_mapped_one_shot, 50, kSmallMessages | kOneSided,
                           "one-sided: every rank reads all peers' inputs in place and sums them in rank order");
COMMLIB_REGISTER_ALGORITHM(AllReduce, "mapped_two_shot", all_reduce_mapped_two_shot, 51, kLargeMessages | kOneSided,
                           "one-sided: rank r sums block r of all inputs in rank order, then all read every block");

}  // namespace sched
}  // namespace commlib
