// The first device call on a group and device sets the stream engine up from C++, without the
// Python device route: _C's set-up (bindings/device_setup_api.h, a capsule of one function beside
// core_api.h's table), which module.cc fetches at import. DeviceCalls::offer (device_calls.cc)
// calls it when the device call cache declined a call, then offers the call again.
#include "bindings/device_setup_api.h"

namespace commlib {
namespace torch_backend {
namespace {
const DeviceSetupApi* g_setup_api = nullptr;
}  // namespace

void set_device_setup_api(const DeviceSetupApi* api) { g_setup_api = api; }

// 1: set up now; 0: nothing done (an engine is there already: the call was declined for an argument
// the Python backend explains; or no set-up from C++ in this process); -1: failed (err).
int set_up_device(void* cache, const CollectiveCall& call, uint8_t kind, int device, uintptr_t stream, CoreError* err) {
  return g_setup_api == nullptr ? 0 : g_setup_api->set_up(cache, call, kind, device, stream, err);
}

}  // namespace torch_backend
}  // namespace commlib
