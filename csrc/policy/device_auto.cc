// See device_auto.h.
#include "policy/device_auto.h"

#include <algorithm>

#include "policy/auto_policy.h"
#include "policy/device_path_tuning.h"
#include "schedule/registry.h"

namespace commlib {

uint64_t kernel_path_crossover(int size) { return device_path_crossover(size, kKernelPathMaxBytes); }

DeviceCallPath device_path_of(bool nccl_requested, uint64_t bytes, DevicePath mode, uint64_t kernel_max_bytes,
                              bool kernel_usable, bool nccl_carries_any) {
  if (nccl_requested) return DeviceCallPath::Nccl;
  if (kernel_usable && !nccl_carries_any && kernel_path_takes(mode, bytes, kernel_max_bytes))
    return DeviceCallPath::Kernel;
  return DeviceCallPath::Copy;
}

namespace {

// The rule's conditions on the call and the engine, apart from the size (device_auto.h).
bool kernel_auto_applies(int size, const Topology& topology, const KernelAutoInputs& in, Collective coll,
                         uint8_t requested, const std::string& policy_source) {
  if (requested != 0 || (coll != Collective::AllReduce && coll != Collective::ReduceScatter) || size < 2) return false;
  if (!in.device_has_kernel_path || in.nccl_links) return false;
  const std::vector<int>& host_of = topology.host_of;
  if (!host_of.empty() && !std::all_of(host_of.begin(), host_of.end(), [&](int h) { return h == host_of[0]; }))
    return false;
  return policy_source == "size" || policy_source == "links" || policy_source == "tuning";
}

bool one_shot_size(int size, uint64_t bytes) { return bytes * static_cast<uint64_t>(size - 1) <= kOneShotBytes; }

// A tuning row measured on the kernel path for this collective and size, where that path takes the call.
bool tuned_row(Collective coll, int size, const KernelAutoInputs& in, uint64_t bytes, std::string* tuned) {
  return kernel_path_takes(in.path, bytes, in.kernel_max_bytes) &&
         tuned_algorithm(coll, static_cast<int64_t>(bytes), size, tuned, 1, true);
}

}  // namespace

bool kernel_auto_may_map(int size, const Topology& topology, const KernelAutoInputs& in, Collective coll,
                         uint8_t requested, uint64_t bytes, const std::string& policy_source) {
  std::string tuned;
  return kernel_path_takes(in.path, bytes, in.kernel_max_bytes) &&
         kernel_auto_applies(size, topology, in, coll, requested, policy_source) && !one_shot_size(size, bytes) &&
         !tuned_row(coll, size, in, bytes, &tuned);
}

uint8_t kernel_auto_algorithm(int size, const Topology& topology, const KernelAutoInputs& in, Collective coll,
                              uint8_t requested, uint64_t bytes, const std::string& policy_source) {
  if (in.peers_mapped && kernel_auto_may_map(size, topology, in, coll, requested, bytes, policy_source))
    return static_cast<uint8_t>(coll == Collective::AllReduce ? algorithm_index(coll, "mapped_fused_two_shot")
                                                              : algorithm_index(coll, "mapped_fused"));
  // reduce_scatter's buffers not mapped: the policy's algorithm (the rules below are all_reduce's).
  if (coll != Collective::AllReduce || !kernel_auto_applies(size, topology, in, coll, requested, policy_source)) return 0;
  if (!kernel_path_takes(in.path, bytes, in.kernel_max_bytes)) return 0;
  std::string tuned;
  if (tuned_row(coll, size, in, bytes, &tuned)) return static_cast<uint8_t>(algorithm_index(Collective::AllReduce, tuned));
  return static_cast<uint8_t>(algorithm_index(Collective::AllReduce, one_shot_size(size, bytes) ? "direct" : "two_shot"));
}

}  // namespace commlib
