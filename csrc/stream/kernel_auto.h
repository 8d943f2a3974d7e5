// What `auto` runs for a small all_reduce on the kernel path (issue #25). The policy's size rule
// picks recursive doubling for small all_reduce on one host: log2 P steps, each a grid barrier and
// a flag round trip between ranks inside the kernel. One launch of the one-shot (`direct`: every
// rank receives every peer's input and reduces, one round) or the two-shot (`two_shot`: a direct
// reduce-scatter, then a direct all-gather, two rounds) is what custom all-reduce kernels use on one
// host instead, so the kernel path asks for those.
//
// The rule must give every rank the same algorithm, and the same before the engines connect as
// after (the first call is described during set-up, before connect, and compared with the peers'
// descriptors: a different algorithm there is a false MismatchError). So it reads only what every
// rank knows alike when its engine is created: whether the device has a kernel path, the
// communicator's host map, the world size and the call (never whether the peers' memory got
// mapped, nor the nccl link). Not COMMLIB_DEVICE_PATH either: every rank must use the same, but
// that is checked at connect, after the first call's check, and ranks that differ in it must hear
// of the setting (ValueError naming it), not of a first call resolved differently; so on one host
// the copy path (forced, or above auto's limit for the kernel path: never, see below) takes the
// same algorithm. It applies when
//   - the call asks for auto and is an all_reduce;
//   - the device has a kernel path and every rank is on one host (the kernel path needs every
//     peer's memory; across hosts host and device resolve auto alike, test_device_multihost.py's
//     test_host_and_device_resolve_auto_alike);
//   - the policy decided by its rules of thumb or the tuning table (source "size", "links",
//     "tuning": the table measures the host executor, not these kernels), not by an override
//     (COMMLIB_ALGO_ALL_REDUCE) or COMMLIB_TOPOLOGY's cost model, which keep their word;
//   - the call has at most kKernelPathMaxBytes (auto's limit for the kernel path; larger calls keep
//     the policy's bandwidth-minded choice whatever the path).
// Then: `direct` while each rank receives at most kOneShotBytes ((P - 1) x the message), else
// `two_shot`. The thresholds are from the shape of the traffic, not measured on a GPU.
#pragma once

#include <cstdint>
#include <string>

#include "plan/plan_cache.h"
#include "stream/kernel_path.h"

namespace commlib {

constexpr uint64_t kOneShotBytes = uint64_t{256} << 10;

// The algorithm index (registry.h) the kernel path's auto asks for instead of the policy's choice
// (`policy_source`: AlgorithmChoice::source), or 0 to keep the policy's.
uint8_t kernel_auto_algorithm(const PlanContext& ctx, bool device_has_kernel_path, const CollectiveCall& call,
                              const std::string& policy_source);

}  // namespace commlib
