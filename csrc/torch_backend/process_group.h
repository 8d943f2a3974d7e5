// The c10d::ProcessGroup of a "commlib" group: torch's own ProcessGroup in every respect but its
// name. torch's _new_process_group_helper builds a plain ProcessGroup for every plugin and marks it
// BackendType::CUSTOM, so its getBackendName() (backendTypeToString, a fixed switch) is "custom"
// whatever the backend calls itself, and DDP's logger, ShardedTensor and anything else that asks
// the group for its backend's name read "custom". The helper also takes a creator's ProcessGroup
// as the group itself ("If the type is a subclass of ProcessGroup then return this process group
// immediately", distributed_c10d.py), so the creator (commlib/torch/native.py) returns this one,
// set up exactly as torch would have set up its own (the same store, rank and size; CUSTOM the
// default backend; the bound device; the C++ backend registered for each device of the group's
// backend string); torch then names it (setGroupName/setGroupDesc) as it names its own.
//
// It overrides getBackendName() and nothing else: every collective is the base class's, which
// calls torch's dispatcher ops (c10d::allreduce_, ...) that call the registered backend, so
// dispatch modes (CommDebugMode) see commlib's calls as they see gloo's. Python sees it as torch's
// ProcessGroup (the class is not registered with pybind11, which then casts to the nearest
// registered base): torch's `type(group) is ProcessGroup` gates (batch_isend_irecv's coalescing,
// destroy_process_group's pending hooks) treat it as they treat their own.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <optional>
#include <string>
#include <vector>

namespace commlib {
namespace torch_backend {

class CommlibProcessGroup final : public c10d::ProcessGroup {
 public:
  // `store`: the group's store (torch's f"{group_name}/" prefix store); `devices`: the device types
  // the group's backend string gives commlib; `bound_device`: init_process_group's device_id.
  CommlibProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                      const c10::intrusive_ptr<c10d::Backend>& backend, const std::vector<c10::Device>& devices,
                      std::optional<c10::Device> bound_device);

  // The name torch's DDP logger records and dist helpers compare ("commlib", as the backend says).
  const std::string getBackendName() const override;
};

}  // namespace torch_backend
}  // namespace commlib
