// CommlibProcessGroup (process_group.h): the group torch would have built, named "commlib".
#include "torch_backend/process_group.h"

#include <utility>

namespace commlib {
namespace torch_backend {

CommlibProcessGroup::CommlibProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                         const c10::intrusive_ptr<c10d::Backend>& backend,
                                         const std::vector<c10::Device>& devices,
                                         std::optional<c10::Device> bound_device)
    : c10d::ProcessGroup(std::move(store), rank, size) {
  // What _new_process_group_helper does to its own group before it registers a plugin's backend
  // (torch 2.13): the plugin's BackendType (CUSTOM) the default, then the bound device, which
  // setBackend hands on to the backend, then the backend for every device of the backend string.
  setDefaultBackend(BackendType::CUSTOM);
  if (bound_device) setBoundDeviceId(bound_device);
  for (const c10::Device& d : devices) setBackend(d.type(), BackendType::CUSTOM, backend);
}

const std::string CommlibProcessGroup::getBackendName() const { return "commlib"; }

}  // namespace torch_backend
}  // namespace commlib
