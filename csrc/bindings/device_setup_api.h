// The device engine's set-up for other extension modules of this process (commlib._C_torch): one
// function pointer in a capsule, `_C.device_setup_api()`, beside core_api.h's table (which stays as
// it is). A C++ caller whose device call found no engine on its device (core_api.h
// device_collective answered 0) asks for one here, then offers the call again: the first call on
// a (group, device) runs without the Python device route (bindings/device_engines.h). Called
// without the GIL; never throws.
#pragma once

#include <cstdint>
#include <memory>

#include "bindings/core_api.h"
#include "bindings/setup_store.h"
#include "plan/call.h"

namespace commlib {

constexpr const char* kDeviceSetupApiCapsule = "commlib._C.device_setup_api.v2";

struct DeviceSetupApi {
  uint32_t version;  // 2 (1 took no kind_out and checked nothing before the set-up)
  // `cache`: the route's device call cache (as device_collective's); `call` the first call (its
  // descriptor is checked against the peers' while they meet: MismatchError for a peer in a host
  // call), `kind`/`kind_out` its buffers' kinds as device_collective's (2 emulated / 3 CUDA),
  // `device`, `stream` the current stream's identity. The call is checked first as the C++ path
  // checks a new shape (bindings/device_call_new_shape.cc): one the Python backend would refuse or
  // explain sets nothing up (0), so a bad argument raises there before this rank meets anyone.
  // 1: the engine is set up (offer the call again); 0: nothing done (an engine is there already,
  // the call is not one the C++ path runs, or this process cannot set one up from C++: hand the
  // call to the Python backend); -1: failed (err; the peers were told through the store).
  int (*set_up)(void* cache, const CollectiveCall& call, uint8_t kind, uint8_t kind_out, int device, uintptr_t stream,
                CoreError* err);
  // The same for a first call that is a batch of sends and receives (`items`, `n`, `dtype`: as
  // core_api.h's device_p2p; its receives are checked against a peer's host messages while the
  // ranks meet, as the route's first batch is).
  int (*set_up_p2p)(void* cache, const P2PItem* items, size_t n, DType dtype, uint8_t kind, int device,
                    uintptr_t stream, CoreError* err);
  // The set-ups of the route whose cache is `cache` meet through `store` from now on (the torch
  // backend's c10d::Store, the very store the route's Python object wraps: the same keys). False
  // when no route has that cache.
  bool (*use_store)(void* cache, std::shared_ptr<SetupStore> store);
};

}  // namespace commlib
