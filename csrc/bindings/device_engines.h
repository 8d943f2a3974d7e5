// `DeviceEngines`: the stream engines of one device route (commlib/core/device_route.py), one per
// device, whoever set them up: the route (the Python communicator's first call on a device) or a
// C++ caller's first call (the torch backend's CUDA tensors, through device_setup_api.h), both by
// device_engine_setup.h's one sequence, under one numbering of their store prefixes
// ("<label>/device<n>", n the engines set up before it plus one: alike on every rank, since every
// rank sets its devices up in the same order). An engine is put in the route's device call cache
// (its streams: bindings/device_p2p_streams.h) as soon as it is connected, so C++ callers' calls run
// at once; the route adopts an engine a C++ caller set up at its next look (find).
//
// What stays Python: NCCL's communicator (commlib/device/nccl_comm.py setup_links, given as
// `nccl_setup` and called under the GIL, only where some pair uses the nccl link), and the store
// itself where it is neither commlib's own (spoken from C++: commlib_setup_store.h) nor torch's, or
// a SignedStore over either (handed over by _C_torch: set_store).
#pragma once

#include <pybind11/pybind11.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings/buffer_view.h"
#include "bindings/core_api.h"
#include "bindings/device_engine_setup.h"
#include "bindings/device_stream_wrapper.h"

namespace commlib {

class DeviceCallCache;

// A CUDA device by index (commlib._C_cuda's device_maker capsule): what a C++ caller's set-up
// makes the engine with, as the route makes it from _C_cuda.device_capsule.
using CudaDeviceMaker = std::shared_ptr<Device> (*)(int index);
constexpr const char* kCudaDeviceMakerCapsule = "commlib.CudaDeviceMaker";

class DeviceEngines {
 public:
  struct Engine {
    std::shared_ptr<StreamEngine> engine;
    std::shared_ptr<Device> device;
    std::string prefix;  // its set-up's store keys
  };

  // `comm`, `store` (Python objects kept alive here), `label`: the communicator's store prefix,
  // `timeout_s`, `cache`: the route's (kept alive by the route, as this), `nccl_setup(engine,
  // prefix)`: NCCL's communicator (Python).
  DeviceEngines(pybind11::object comm, pybind11::object store, std::string label, double timeout_s,
                DeviceCallCache* cache, pybind11::object nccl_setup);
  ~DeviceEngines();

  // The engine of `kind`:`device`, if one was set up.
  bool find(BufferKind kind, int device, Engine* out);
  // Sets it up (device_engine_setup.h, then NCCL's communicator where needed) and puts it in the
  // cache. `poll`/`what`: the first call's check and name (DeviceEngineSetup). Throws (the peers
  // told). Without the GIL.
  Engine set_up(BufferKind kind, int device, std::shared_ptr<Device> d, std::function<void(StreamEngine&)> poll,
                const std::string& what);
  // Every engine set up so far, in set-up order: (kind, device, engine).
  std::vector<std::pair<std::pair<int, int>, Engine>> all();
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return engines_.size();
  }
  // The communicator's ranks (the first call's root is checked against it before a set-up).
  int world_size() const { return comm_.size(); }
  // Forgets them (the route closed them): C++ callers set nothing up after it (set_up_for: 0).
  void clear();

  // The store the set-ups meet through from now on (the torch backend's c10d::Store over the same
  // keys as the Python object it was given: commlib._C_torch, device_setup_api.h use_store). Where
  // that object is a SignedStore (COMMLIB_SECRET), `store` is the store it wraps (torch's), and the
  // set-ups sign and verify over it with the SignedStore's key, as the object does
  // (commlib_setup_store.h signed_setup_store): from C++, the GIL untouched.
  void set_store(std::shared_ptr<SetupStore> store);
  // Whether the set-ups meet through the store's Python object (its set/check/get under the GIL):
  // false for commlib's own store (read once at construction) and once torch's store was given.
  bool python_store();

  // CUDA for C++ callers: _C_cuda's device maker and stream wrapper (the route gives them once the
  // process has CUDA); without them a C++ caller's first CUDA call is the route's.
  void set_cuda(CudaDeviceMaker make, CudaStreamWrapper wrap);

  // A C++ caller's first call `call` on `kind`:`device`, current stream `stream` (core_api.h's
  // identity), found no engine: sets one up. 1: set up now; 0: nothing done (one is set up already,
  // so the call was declined for another reason, or this caller cannot set one up: CUDA without
  // set_cuda); -1: failed (err), the peers told. Without the GIL.
  int set_up_for(const CollectiveCall& call, uint8_t kind, int device, uintptr_t stream, CoreError* err);
  // The same for a first batch of sends and receives (`items` in `dtype`).
  int set_up_for_p2p(const std::vector<P2PItem>& items, DType dtype, uint8_t kind, int device, uintptr_t stream,
                     CoreError* err);

  // The route's registry of a cache (set_up_for's caller has the cache only). Null when none.
  static std::shared_ptr<DeviceEngines> of_cache(const void* cache);
  static void register_cache(const void* cache, const std::shared_ptr<DeviceEngines>& engines);

 private:
  void add_to_cache(BufferKind kind, int device, const Engine& e);
  // set_up_for's body: `poll` and `what` the first call's check and name.
  int set_up_from_cpp(uint8_t kind, int device, uintptr_t stream, std::function<void(StreamEngine&)> poll,
                      const std::string& what, CoreError* err);
  pybind11::object comm_ref_, store_ref_, nccl_setup_;
  Communicator& comm_;
  std::shared_ptr<SetupStore> store_;
  const std::string signing_key_;  // the Python store's, where it is a SignedStore (set_store)
  bool python_store_ = true;
  bool closed_ = false;  // (clear: the route closed)
  const std::string label_;
  const double timeout_s_;
  DeviceCallCache* cache_;
  std::mutex setup_mu_;  // one set-up at a time (the numbering)
  std::mutex mu_;        // engines_
  std::vector<std::pair<std::pair<int, int>, Engine>> engines_;
  CudaDeviceMaker make_cuda_ = nullptr;
  CudaStreamWrapper wrap_cuda_ = nullptr;
};

// The Python store's set/check/get under the GIL (device_engine_setup_bindings.cc), and how many
// of them ran in this process (tests: a set-up over torch's c10d::Store makes none).
std::unique_ptr<SetupStore> python_setup_store(pybind11::object store);
uint64_t python_setup_store_calls();

}  // namespace commlib
