// See device_auto.h.
#include "policy/device_auto.h"

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "policy/auto_policy.h"
#include "policy/device_path_tuning.h"
#include "policy/tie_rule.h"
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
bool kernel_auto_applies(int size, const Topology& topology, const KernelAutoInputs& in, const KernelAutoCall& call) {
  if (call.requested != 0 || (call.coll != Collective::AllReduce && call.coll != Collective::ReduceScatter) || size < 2)
    return false;
  if (!in.device_has_kernel_path || in.nccl_links || !kernel_path_takes(in.path, call.bytes(), in.kernel_max_bytes))
    return false;
  const std::vector<int>& host_of = topology.host_of;
  if (!host_of.empty() && !std::all_of(host_of.begin(), host_of.end(), [&](int h) { return h == host_of[0]; }))
    return false;
  return call.policy_source == "size" || call.policy_source == "links" || call.policy_source == "tuning";
}

// A tuning row measured on the kernel path for this collective and size.
bool tuned_row(const KernelAutoCall& call, int size, std::string* tuned) {
  return tuned_algorithm(call.coll, static_cast<int64_t>(call.bytes()), size, tuned, 1, true);
}

// The model's choice, memoised: the candidates' schedules are built and costed once per shape.
struct ChoiceKey {
  int coll, size, elem_bytes, route;
  int64_t count;
  uint64_t slots_bytes, registry;
  std::string policy_algorithm;
  double one_block_bytes, block_bytes;  // the grid settings (a user may change them); the fits are constants
  bool operator<(const ChoiceKey& o) const {
    return std::tie(coll, size, elem_bytes, route, count, slots_bytes, registry, policy_algorithm, one_block_bytes,
                    block_bytes) < std::tie(o.coll, o.size, o.elem_bytes, o.route, o.count, o.slots_bytes, o.registry,
                                            o.policy_algorithm, o.one_block_bytes, o.block_bytes);
  }
};
constexpr size_t kChoiceMemo = 4096;  // shapes kept (then forgotten all at once: a bound, not a policy)

std::string model_choice(const KernelAutoCall& call, int size, DeviceRoute route, uint64_t slots_bytes,
                         const DeviceCostParams& params) {
  static std::mutex mu;
  static std::map<ChoiceKey, std::string> memo;
  const ChoiceKey key{static_cast<int>(call.coll), size, call.elem_bytes, static_cast<int>(route), call.count,
                      route == DeviceRoute::Slots ? slots_bytes : 0, registry_generation(),
                      call.coll == Collective::AllReduce ? std::string() : call.policy_algorithm,
                      params.one_block_bytes, params.block_bytes};
  {
    std::lock_guard<std::mutex> lk(mu);
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
  }
  // The tie rule of every choice by predicted time (tie_rule.h): the first candidate within the tie of the least.
  const std::vector<KernelAutoCandidate> cands =
      kernel_auto_candidates(call.coll, size, call.count, call.elem_bytes, route, slots_bytes, call.policy_algorithm,
                             params);
  std::vector<double> times;
  for (const KernelAutoCandidate& k : cands) times.push_back(k.fits ? k.cost.seconds : std::numeric_limits<double>::infinity());
  const size_t pick = tie_pick(times);
  const std::string best = pick < cands.size() ? cands[pick].algorithm : std::string();
  std::lock_guard<std::mutex> lk(mu);
  if (memo.size() >= kChoiceMemo) memo.clear();
  memo.emplace(key, best);
  return best;
}

}  // namespace

std::vector<KernelAutoCandidate> kernel_auto_candidates(Collective coll, int size, int64_t count, int elem_bytes,
                                                        DeviceRoute route, uint64_t slots_bytes,
                                                        const std::string& policy_algorithm,
                                                        const DeviceCostParams& params) {
  std::vector<std::string> names;
  if (coll == Collective::AllReduce)
    names = {"direct", "two_shot"};
  else if (!policy_algorithm.empty())
    names = {policy_algorithm};
  for (const AlgorithmSpec& spec : algorithm_specs(coll))
    if ((spec.traits & kOneSided) && std::find(names.begin(), names.end(), spec.name) == names.end())
      names.push_back(spec.name);
  std::vector<KernelAutoCandidate> out;
  for (const std::string& name : names) {
    KernelAutoCandidate k{name, device_call_cost(coll, name, size, count, elem_bytes, route, params), true};
    if (route == DeviceRoute::Slots && algorithm_is_one_sided(coll, name)) k.fits = k.cost.stage_need <= slots_bytes;
    out.push_back(std::move(k));
  }
  return out;
}

namespace {
// Each rank receives at most kOneShotBytes: the handshakes' regime, where the model has no fit.
bool one_shot_size(int size, uint64_t bytes) { return bytes * static_cast<uint64_t>(size - 1) <= kOneShotBytes; }
}  // namespace

std::string kernel_auto_choice(const KernelAutoCall& call, int size, DeviceRoute route, uint64_t slots_bytes,
                               const DeviceCostParams& params) {
  // Rule 2, but for an all_reduce on mapped buffers: the model (device_auto.h says why)
  const bool measured = call.coll == Collective::AllReduce && route == DeviceRoute::Mapped;
  if (!measured && one_shot_size(size, call.bytes()))  // the one-shot (all_reduce), else the policy's
    return call.coll == Collective::AllReduce ? "direct" : call.policy_algorithm;
  return model_choice(call, size, route, slots_bytes, params);
}

bool kernel_auto_may_map(int size, const Topology& topology, const KernelAutoInputs& in, const KernelAutoCall& call) {
  std::string tuned;
  if (!kernel_auto_applies(size, topology, in, call) || tuned_row(call, size, &tuned)) return false;
  return algorithm_is_one_sided(call.coll, kernel_auto_choice(call, size, DeviceRoute::Mapped, in.slots_bytes, in.cost));
}

uint8_t kernel_auto_algorithm(int size, const Topology& topology, const KernelAutoInputs& in, const KernelAutoCall& call) {
  if (!kernel_auto_applies(size, topology, in, call)) return 0;
  std::string name;
  if (!tuned_row(call, size, &name)) name = kernel_auto_choice(call, size, in.route, in.slots_bytes, in.cost);
  if (name.empty() || name == call.policy_algorithm) return 0;
  return static_cast<uint8_t>(algorithm_index(call.coll, name));
}

std::string device_fallback_algorithm(const KernelAutoCall& call, int size) {
  if (call.requested != 0 || call.policy_source == "override" || call.policy_source == "requested" ||
      !algorithm_is_host_only(call.coll, call.policy_algorithm))
    return "";
  return builtin_algorithm(call.coll, static_cast<int64_t>(call.bytes()), size);
}

}  // namespace commlib
