// Lowering a schedule (schedule/ir.h, the IR the host executor, verifier and simulator run) for
// one rank and one call shape into a device plan (device_plan_types.h) the kernel executor
// interprets, and the check that a plan is its schedule: the same messages (peer, order, bytes)
// and the same regions, step for step. A step's messages with one peer in one direction (ir.h:
// several match in op order) are one stream of chunks numbered on from the pair's, in op order,
// and round i of the step moves chunk i of every pair's stream, so the kernel sees what it sees of
// one message per pair (plan_kernel.cuh's order and slots unchanged). The stream engine caches plans per call shape
// (stream/kernel_path.h); the verifier's sweep checks every built-in algorithm's plans
// (tests/kernels/test_device_plans.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/device_plan_types.h"
#include "schedule/ir.h"

namespace commlib {

struct DevicePlan {
  std::vector<kplan::PlanStep> steps;
  std::vector<kplan::PlanItem> items;
  std::vector<uint32_t> sends_to;     // per peer: chunks this rank sends it in the call (one-sided: signals)
  std::vector<uint32_t> recvs_from;   // per peer: chunks this rank receives from it (one-sided: waits)
  uint64_t chunk_bytes = 0;
  size_t esize = 0;
  uint32_t widest_step = 0;  // most items in one step (the kernel's useful parallelism)
  bool reduces = false;      // some item reduces (the kernel needs the op's functor)
  // A one-sided schedule's plan (one_sided_plan.h): items get/get_reduce/put/signal/wait and local
  // copies and reductions, no message; `peer_bufs` has bit b set when an item addresses buffer b
  // (BufferId) of a peer.
  bool one_sided = false;
  uint8_t peer_bufs = 0;
};

// `chunk_bytes`: the most bytes one item moves (the inbox slot), rounded down to whole elements.
// Throws std::invalid_argument for a malformed schedule (a peer out of range, a negative region).
// A one-sided schedule (ir.h) is lowered by lower_one_sided (one_sided_plan.h), chunk_bytes unused.
DevicePlan lower_schedule(const Schedule& sched, int rank, int size, size_t esize, uint64_t chunk_bytes);

// "" when `plan` is exactly `sched` lowered for this rank (same steps; per step the same local
// operations and messages, each covering the same regions, the items in the kernel's order, chunk
// indices continuing per pair across steps, the per-peer totals right); otherwise what differs.
std::string check_device_plan(const DevicePlan& plan, const Schedule& sched, int rank, int size, size_t esize);

// Builds every rank's schedule of (collective, algorithm, size, count, root), lowers and checks
// each one, and checks the pairs across ranks (what rank a sends b, in chunks, is what b receives
// from a, step for step). Throws std::runtime_error naming the rank and the difference.
void check_device_plans(Collective coll, const std::string& algorithm, int size, int64_t count, int root,
                        size_t esize, uint64_t chunk_bytes);

}  // namespace commlib
