// Device plans of one-sided schedules (schedule/ir.h "One-sided operations"; trait kOneSided): the
// lowering, the check that a plan is its schedule, and the checks across the ranks' plans that the
// kernel (plan_one_sided.cuh) relies on.
//
// A one-sided plan's step is: its waits, then its data items (get / get_reduce / put over a peer's
// buffer, local copy / reduce), then its signals: the IR's step semantics, in the kernel's order.
// A data operation is one item, or several of at most kOneSidedItemBytes cut at the same offsets
// from the region's start. The kernel runs every item on every block, each block a share of the
// item's bytes (share_of: the same cut for the same length), with its own flags per (peer, tag,
// block): no grid barrier between steps. That is sound when *block locality* holds: any two items,
// on any ranks, that touch the same bytes of a rank's buffer address the same byte range (identical
// or disjoint ranges, both in the out-of-place and the in-place layout), so the same block handles
// both and a block's signal orders exactly what the waiting block then touches.
// check_one_sided_pairs proves it for a world's plans, beside signals matching waits per tag.
#pragma once

#include <string>
#include <vector>

#include "kernels/device_plan.h"
#include "schedule/ir.h"

namespace commlib {

// `sched` must use one-sided operations (uses_one_sided); std::invalid_argument for a malformed one.
DevicePlan lower_one_sided(const Schedule& sched, int rank, int size, size_t esize);

// "" when `plan` is `sched` lowered for this rank (the same steps; per step the same waits and
// signals, with peer and tag, and data items tiling each data operation's regions, in the kernel's
// order; the per-peer signal and wait totals and the summary fields right); otherwise what differs.
std::string check_one_sided_plan(const DevicePlan& plan, const Schedule& sched, int rank, int size, size_t esize);

// Across every rank's plan of one call (plans[r] is rank r's): every rank waits, per peer and tag,
// for exactly as many signals as that peer sends it, and block locality holds (above) out of place
// and, for the collectives with an in-place form, in place. "" or what fails.
std::string check_one_sided_pairs(const std::vector<DevicePlan>& plans, Collective coll, int64_t count, size_t esize);

}  // namespace commlib
