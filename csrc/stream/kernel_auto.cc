// See kernel_auto.h.
#include "stream/kernel_auto.h"

#include <algorithm>

#include "policy/auto_policy.h"
#include "schedule/registry.h"

namespace commlib {

uint8_t kernel_auto_algorithm(const PlanContext& ctx, const KernelAutoInputs& in, const CollectiveCall& call,
                              const std::string& policy_source) {
  if (call.algo != 0 || call.coll != Collective::AllReduce || ctx.size < 2) return 0;
  const uint64_t bytes = static_cast<uint64_t>(call.count) * dtype_size(call.dtype);
  if (!in.device_has_kernel_path || in.nccl_links || !kernel_path_takes(in.path, bytes, in.kernel_max_bytes)) return 0;
  const std::vector<int>& host_of = ctx.topology.host_of;
  if (!host_of.empty() && !std::all_of(host_of.begin(), host_of.end(), [&](int h) { return h == host_of[0]; }))
    return 0;
  if (policy_source != "size" && policy_source != "links" && policy_source != "tuning") return 0;
  std::string tuned;
  if (tuned_algorithm(Collective::AllReduce, static_cast<int64_t>(bytes), ctx.size, &tuned, 1, true))
    return static_cast<uint8_t>(algorithm_index(Collective::AllReduce, tuned));
  if (bytes > in.kernel_max_bytes) return 0;
  const bool one_shot = bytes * static_cast<uint64_t>(ctx.size - 1) <= kOneShotBytes;
  return static_cast<uint8_t>(algorithm_index(Collective::AllReduce, one_shot ? "direct" : "two_shot"));
}

}  // namespace commlib
