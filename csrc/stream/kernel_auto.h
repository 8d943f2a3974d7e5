// What `auto` runs for an all_reduce on the kernel path (issue #25): the one rule, here.
//
// The policy's size rule picks recursive doubling for small all_reduce on one host: log2 P steps,
// each a grid barrier and a flag round trip between ranks inside the kernel. One launch of the
// one-shot (`direct`: every rank receives every peer's input and reduces, one round) or the
// two-shot (`two_shot`: a direct reduce-scatter, then a direct all-gather, two rounds) is what custom
// all-reduce kernels use on one host instead, so the kernel path asks for those. On the copy path a
// one-shot's P - 1 messages per rank are P - 1 copy-engine copies and flag waits each, a different
// trade-off, so there the policy's choice stands.
//
// The rule applies only to a call the kernel path runs:
//   - the call asks for auto and is an all_reduce of 2 ranks or more;
//   - the device has a kernel path, COMMLIB_DEVICE_PATH lets it take a call of this size
//     (kernel_path_takes: kernel, or auto up to its crossover, the tuning file's "device_path" for
//     this world size else kKernelPathMaxBytes: policy/device_path_tuning.h; never copy), COMMLIB_DEVICE_LINK
//     is not nccl (every pair over NCCL: no kernel), and every rank is on one host (the kernel path
//     needs every peer's memory; across hosts host and device resolve auto alike,
//     test_device_multihost.py's test_host_and_device_resolve_auto_alike);
//   - the policy decided by its rules of thumb or the host tuning table (source "size", "links",
//     "tuning": those rows measure the host executor, not these kernels), not by an override
//     (COMMLIB_ALGO_ALL_REDUCE) or COMMLIB_TOPOLOGY's cost model, which keep their word.
// Then, in order:
//   1. a tuning row measured on the kernel path (the tuning file's "kernel_path" section, TuningRow::
//      kernel_path) for this world size and size wins: a measurement beats the rule of thumb;
//   2. up to the crossover: `direct` while each rank receives at most kOneShotBytes ((P - 1) x
//      the message), else `two_shot`. Larger calls (COMMLIB_DEVICE_PATH=kernel) keep the policy's
//      bandwidth-minded choice. The thresholds are from the shape of the traffic, not measured on a GPU.
//
// Every rank must get the same algorithm, and the same before the engines connect as after (the
// first call is described during set-up, before connect, and compared with the peers'
// descriptors). So the rule reads only what a rank knows when its engine is created: its settings
// (COMMLIB_DEVICE_PATH and COMMLIB_DEVICE_LINK, which connect then checks are the same everywhere),
// the tuning table, the crossover its kernel path read when created (connect checks it too), the device, the host map, the world size and the call; never whether the peers'
// memory got mapped. Ranks that differ in one of those settings resolve auto differently before
// connect; the first call's check lets a difference in the algorithm alone pass to connect, whose
// check names the setting (StreamEngine::check_first_call).
#pragma once

#include <cstdint>
#include <string>

#include "plan/plan_cache.h"
#include "stream/kernel_path.h"

namespace commlib {

constexpr uint64_t kOneShotBytes = uint64_t{256} << 10;

// What the rule reads of the engine, all known when it is created.
struct KernelAutoInputs {
  bool device_has_kernel_path = false;  // Device::plan_blocks(1) > 0
  DevicePath path = DevicePath::Auto;   // COMMLIB_DEVICE_PATH
  bool nccl_links = false;              // COMMLIB_DEVICE_LINK=nccl
  uint64_t kernel_max_bytes = kKernelPathMaxBytes;  // auto's crossover (KernelPath::kernel_max_bytes)
};

// The algorithm index (registry.h) the kernel path's auto asks for instead of the policy's choice
// (`policy_source`: AlgorithmChoice::source), or 0 to keep the policy's.
uint8_t kernel_auto_algorithm(const PlanContext& ctx, const KernelAutoInputs& in, const CollectiveCall& call,
                              const std::string& policy_source);

}  // namespace commlib
