// The device plan's plain data (kernels/device_plan.h lowers a schedule into it): what the kernel
// executor (kernels/plan_kernel.cuh) reads on the device, so nothing here but fixed-size PODs.
//
// A plan is one rank's schedule for one call shape, flattened: steps of items, an item being one
// chunk (at most the inbox slot's bytes) of one schedule operation, its regions already resolved
// to a buffer id and a byte offset. Within a step the items are ordered: local copies and
// reductions first, then, for chunk index i = 0, 1, ...: chunk i of every send, then chunk i of
// every receive. That order is what makes the kernel deadlock-free whatever the schedule's shape
// (see plan_kernel.cuh).
#pragma once

#include <cstdint>

namespace commlib {
namespace kplan {

enum ItemKind : uint8_t {
  kSend = 0,        // peer's inbox slot <- src
  kRecv = 1,        // dst <- inbox slot
  kRecvReduce = 2,  // dst <- (src or dst) (op) inbox slot
  kCopy = 3,        // dst <- src
  kReduce = 4,      // dst <- dst (op) src
  // One-sided items (a one-sided schedule's plan, kernels/one_sided_plan.h; plan_one_sided.cuh runs
  // them): never chunked through a slot, every block moves its share of the region in place.
  kGet = 5,         // dst <- the peer's src (src_buf/src_off address the peer's buffer)
  kGetReduce = 6,   // dst <- dst (op) the peer's src
  kPut = 7,         // the peer's dst <- src (dst_buf/dst_off address the peer's buffer)
  kSignal = 8,      // one more on the peer's flag (this rank, tag = `chunk`), per block
  kWait = 9,        // consume one signal (peer, tag = `chunk`), per block
  kReduceToAll = 10,  // every rank's dst <- src of ranks 0, 1, ..., P-1 reduced in that order (peer -1;
                      // the peers' buffers at the same offsets, read and written in place)
  kReduceFromAll = 11,  // the same into this rank's dst only (the peers' srcs read in place)
};
constexpr uint8_t kItemKinds = 12;
// Signal tags per pair (schedule/ir.h kSignalTags; one_sided_plan.cc checks they agree).
constexpr uint32_t kSignalTags = 8;
// The most bytes one one-sided item moves (a larger operation is several items, cut at the same
// offsets on every rank, so the blocks' shares of one region agree: one_sided_plan.h).
constexpr uint64_t kOneSidedItemBytes = uint64_t(1) << 30;

// Buffer ids: the schedule's Input / Output / Scratch (schedule/ir.h BufferId), or none.
constexpr uint8_t kNoBuffer = 0xff;

struct PlanItem {  // 32 bytes
  uint8_t kind = kCopy;
  uint8_t dst_buf = kNoBuffer;
  uint8_t src_buf = kNoBuffer;  // recv_reduce without a source: kNoBuffer (reduces into dst)
  uint8_t pad = 0;
  int32_t peer = -1;            // messages only
  uint32_t chunk = 0;           // messages: the pair's chunk index within the call (from 0); signal/wait: the tag
  uint32_t bytes = 0;           // bytes of this chunk (0: a zero-byte message's one chunk)
  int64_t dst_off = 0;          // bytes into dst_buf
  int64_t src_off = 0;          // bytes into src_buf
};
static_assert(sizeof(PlanItem) == 32, "PlanItem is uploaded as is");

struct PlanStep {
  uint32_t first = 0;  // index of its first item
  uint32_t count = 0;  // items
};

}  // namespace kplan
}  // namespace commlib
