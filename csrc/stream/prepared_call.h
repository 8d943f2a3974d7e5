// A device collective resolved once (issue #37, item 2): what the bindings' call cache keeps so that
// a steady call on the stream engine (stream_engine.h) looks nothing up. Apart from the engine: the
// cache and the engine's call paths share it, and it changes with the routes, not the engine.
#pragma once

#include <memory>

#include "plan/call.h"
#include "plan/plan_cache.h"
#include "policy/device_auto.h"
#include "stream/device_path.h"

namespace commlib {

// A call resolved once (issue #37, item 2; the bindings' call cache keeps it): the call with the
// algorithm the kernel path's auto picks pinned, its plan (held: the plan cache may drop it, this
// keeps it) and its path, so a steady call looks nothing up. Valid while the tuning table and the
// algorithm registry it was made under stay (the cache checks their generations).
struct PreparedCall {
  CollectiveCall call;
  std::shared_ptr<const ResolvedPlan> plan;
  DeviceCallPath path = DeviceCallPath::Copy;
  // The kernel path's device plan, found on the first launch (shared by the copies the bindings'
  // cache makes per call; written under the engine's enqueue lock).
  std::shared_ptr<KernelPlanSlot> kernel_plan = std::make_shared<KernelPlanSlot>();
  // An auto call whose route the ranks agree on per call (one_sided_candidate: the mapped two-shot
  // where every rank's buffers are mapped): `call` keeps algo 0 (a capture resolves it as an
  // unprepared rank does), `plan` is the route's plan staged in the arena and `mapped_plan` when
  // mapped, each with its device plan's slot: the agreement stays per call, no lookup does.
  // `slots_plan`: its plan staged through the slots (pool staging turned off on every rank by an arena
  // no rank could share), also an auto call's that stages without agreeing (premul_sum: prepare).
  bool agrees_route = false;
  std::shared_ptr<const ResolvedPlan> mapped_plan;
  std::shared_ptr<KernelPlanSlot> mapped_kernel_plan = std::make_shared<KernelPlanSlot>();
  std::shared_ptr<const ResolvedPlan> slots_plan;
  std::shared_ptr<KernelPlanSlot> slots_kernel_plan = std::make_shared<KernelPlanSlot>();
};

}  // namespace commlib
