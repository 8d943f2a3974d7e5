// The first device call on a group and device sets the stream engine up from C++, without the
// Python device route: _C's set-up (bindings/device_setup_api.h, a capsule of one function beside
// core_api.h's table), which module.cc fetches at import. DeviceCalls::offer (device_calls.cc)
// calls it when the device call cache declined a call, then offers the call again. The set-ups
// meet through the group's c10d::Store itself (C10dSetupStore), not its Python binding.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>
#include <vector>

#include "bindings/device_setup_api.h"

namespace commlib {
namespace torch_backend {
namespace {
const DeviceSetupApi* g_setup_api = nullptr;

// torch's store, called from C++ (no GIL, no Python): the keys and values the route's Python
// object would read and write, since that object is this very store.
class C10dSetupStore : public SetupStore {
 public:
  explicit C10dSetupStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  bool try_get(const std::string& key, std::string* value) override {
    if (!store_->check({key})) return false;
    const std::vector<uint8_t> v = store_->get(key);
    value->assign(v.begin(), v.end());
    return true;
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};
}  // namespace

bool use_c10d_setup_store(void* cache, c10::intrusive_ptr<c10d::Store> store) {
  return g_setup_api != nullptr && g_setup_api->use_store(cache, std::make_shared<C10dSetupStore>(std::move(store)));
}

void set_device_setup_api(const DeviceSetupApi* api) { g_setup_api = api; }

// 1: set up now; 0: nothing done (an engine is there already: the call was declined for an argument
// the Python backend explains; or no set-up from C++ in this process); -1: failed (err).
int set_up_device(void* cache, const CollectiveCall& call, uint8_t kind, uint8_t kind_out, int device, uintptr_t stream,
                  CoreError* err) {
  return g_setup_api == nullptr ? 0 : g_setup_api->set_up(cache, call, kind, kind_out, device, stream, err);
}

int set_up_device_p2p(void* cache, const std::vector<P2PItem>& items, DType dtype, uint8_t kind, int device,
                      uintptr_t stream, CoreError* err) {
  return g_setup_api == nullptr ? 0
                                : g_setup_api->set_up_p2p(cache, items.data(), items.size(), dtype, kind, device, stream,
                                                          err);
}

}  // namespace torch_backend
}  // namespace commlib
