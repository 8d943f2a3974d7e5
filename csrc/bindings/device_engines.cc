// DeviceEngines (device_engines.h): one registry of a route's engines, set up by the route or by a
// C++ caller's first call through the same sequence (device_engine_setup.h).
#include "bindings/device_engines.h"

#include <stdexcept>
#include <unordered_map>

#include "bindings/commlib_setup_store.h"
#include "bindings/device_call_cache.h"
#include "bindings/error_kinds.h"
#include "bindings/gil.h"
#include "device/emulated/emulated_device.h"

namespace py = pybind11;

namespace commlib {
namespace {

std::mutex registry_mu;
std::unordered_map<const void*, std::weak_ptr<DeviceEngines>>& registry() {
  static auto* r = new std::unordered_map<const void*, std::weak_ptr<DeviceEngines>>();  // (never destroyed: exit order)
  return *r;
}

}  // namespace

DeviceEngines::DeviceEngines(py::object comm, py::object store, std::string label, double timeout_s,
                             DeviceCallCache* cache, py::object nccl_setup)
    : comm_ref_(std::move(comm)),
      store_ref_(store),
      nccl_setup_(std::move(nccl_setup)),
      comm_(comm_ref_.cast<Communicator&>()),
      store_(commlib_setup_store(store)),  // commlib's own store, read once here: C++ from now on
      signing_key_(store_signing_key(store)),
      label_(std::move(label)),
      timeout_s_(timeout_s),
      cache_(cache) {
  python_store_ = store_ == nullptr;
  if (python_store_) store_ = python_setup_store(std::move(store));  // another store: its Python object's calls
}

DeviceEngines::~DeviceEngines() {
  // The Python objects go under the GIL, whichever thread let go of this last (a C++ caller's
  // set_up_for holds it while it runs).
  if (!interpreter_finalizing()) {
    py::gil_scoped_acquire gil;
    store_.reset();
    comm_ref_ = py::object();
    store_ref_ = py::object();
    nccl_setup_ = py::object();
  } else {  // (the interpreter is going: nothing of it may be touched)
    new std::shared_ptr<SetupStore>(std::move(store_));  // (leaked on purpose)
    comm_ref_.release();
    store_ref_.release();
    nccl_setup_.release();
  }
  std::lock_guard<std::mutex> lock(registry_mu);
  for (auto it = registry().begin(); it != registry().end();) {
    if (it->second.expired()) it = registry().erase(it);
    else ++it;
  }
}

std::shared_ptr<DeviceEngines> DeviceEngines::of_cache(const void* cache) {
  std::lock_guard<std::mutex> lock(registry_mu);
  const auto it = registry().find(cache);
  return it == registry().end() ? nullptr : it->second.lock();
}

void DeviceEngines::register_cache(const void* cache, const std::shared_ptr<DeviceEngines>& engines) {
  std::lock_guard<std::mutex> lock(registry_mu);
  registry()[cache] = engines;
}

bool DeviceEngines::find(BufferKind kind, int device, Engine* out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : engines_) {
    if (e.first == std::make_pair(static_cast<int>(kind), device)) {
      *out = e.second;
      return true;
    }
  }
  return false;
}

std::vector<std::pair<std::pair<int, int>, DeviceEngines::Engine>> DeviceEngines::all() {
  std::lock_guard<std::mutex> lock(mu_);
  return engines_;
}

void DeviceEngines::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  engines_.clear();
  closed_ = true;
}

void DeviceEngines::set_store(std::shared_ptr<SetupStore> store) {
  if (!signing_key_.empty()) store = signed_setup_store(std::move(store), signing_key_);
  std::lock_guard<std::mutex> one_at_a_time(setup_mu_);
  std::shared_ptr<SetupStore> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = std::move(store_);
    store_ = std::move(store);
    python_store_ = false;
  }
  if (old && !interpreter_finalizing()) {  // (the Python object's adapter goes under the GIL)
    py::gil_scoped_acquire gil;
    old.reset();
  }
}

bool DeviceEngines::python_store() {
  std::lock_guard<std::mutex> lock(mu_);
  return python_store_;
}

void DeviceEngines::set_cuda(CudaDeviceMaker make, CudaStreamWrapper wrap) {
  std::lock_guard<std::mutex> lock(mu_);
  make_cuda_ = make;
  wrap_cuda_ = wrap;
}

void DeviceEngines::add_to_cache(BufferKind kind, int device, const Engine& e) {
  DeviceP2PStreams::Wrap wrap;
  if (kind == BufferKind::Emulated) {
    std::shared_ptr<EmulatedDevice> d = std::dynamic_pointer_cast<EmulatedDevice>(e.device);
    if (d) wrap = [d](uintptr_t id) { return d->stream_named(id); };
  } else if (wrap_cuda_ != nullptr) {
    const CudaStreamWrapper fn = wrap_cuda_;
    wrap = [fn, device](uintptr_t stream) { return fn(device, stream); };
  }
  // Without a wrap (CUDA before set_cuda) the route's add_engine gives it when it adopts the engine.
  if (wrap) cache_->streams().add_engine(kind, device, e.engine, std::move(wrap));
}

DeviceEngines::Engine DeviceEngines::set_up(BufferKind kind, int device, std::shared_ptr<Device> d,
                                            std::function<void(StreamEngine&)> poll, const std::string& what) {
  std::lock_guard<std::mutex> one_at_a_time(setup_mu_);
  Engine found;
  if (find(kind, device, &found)) return found;  // another thread of this rank set it up meanwhile
  size_t n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = engines_.size() + 1;
  }
  Engine e{nullptr, d, label_ + "/device" + std::to_string(n)};
  std::shared_ptr<SetupStore> store;
  {
    std::lock_guard<std::mutex> lock(mu_);
    store = store_;  // (set_store waits for this set-up: setup_mu_)
  }
  struct Idle {  // (on every exit: the store lets go of what only a set-up needs, its connection)
    SetupStore& s;
    ~Idle() {
      try {
        s.idle();
      } catch (...) {
      }
    }
  } idle{*store};
  DeviceEngineSetup s{comm_, std::move(d), timeout_s_, label_, e.prefix, std::move(poll), what};
  e.engine = set_up_device_engine(s, *store);
  if (e.engine->needs_nccl()) {
    // NCCL's communicator (its library's candidates and unique id are Python's: nccl_comm.py).
    try {
      py::gil_scoped_acquire gil;
      nccl_setup_(e.engine, e.prefix);
    } catch (const std::exception& err) {
      try {  // the other ranks stop waiting for this one
        store->set(e.prefix + "/error", setup_failure_report(comm_.rank(), err));
      } catch (...) {
      }
      throw;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    engines_.push_back({{static_cast<int>(kind), device}, e});
  }
  add_to_cache(kind, device, e);
  return e;
}

int DeviceEngines::set_up_for(const CollectiveCall& call, uint8_t kind, int device, uintptr_t stream,
                              CoreError* err) {
  return set_up_from_cpp(kind, device, stream, [call](StreamEngine& e) { e.check_first_call(call); },
                         collective_name(call.coll), err);
}

int DeviceEngines::set_up_for_p2p(const std::vector<P2PItem>& items, DType dtype, uint8_t kind, int device,
                                  uintptr_t stream, CoreError* err) {
  return set_up_from_cpp(kind, device, stream, [items, dtype](StreamEngine& e) { e.check_first_p2p(items, dtype); },
                         "point-to-point", err);
}

int DeviceEngines::set_up_from_cpp(uint8_t kind_code, int device, uintptr_t stream,
                                   std::function<void(StreamEngine&)> poll, const std::string& what, CoreError* err) {
  const auto kind = static_cast<BufferKind>(kind_code);
  Engine found;
  if (find(kind, device, &found)) return 0;  // declined for another reason: the caller's hand-over explains it
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return 0;  // the communicator closed: its Python side raises that
  }
  try {
    std::shared_ptr<Device> d;
    std::shared_ptr<DeviceStream> s;
    if (kind == BufferKind::Emulated) {
      auto emulated = emulated_device(device);
      s = emulated->stream_named(stream);
      d = std::move(emulated);
    } else if (kind == BufferKind::Cuda) {
      CudaDeviceMaker make;
      CudaStreamWrapper wrap;
      {
        std::lock_guard<std::mutex> lock(mu_);
        make = make_cuda_;
        wrap = wrap_cuda_;
      }
      if (make == nullptr || wrap == nullptr) return 0;  // the route sets it up (no CUDA handed here)
      d = make(device);
      s = wrap(device, stream);
    } else {
      return 0;
    }
    if (s && d->capture_status(*s) != CaptureStatus::None)
      throw CommError("rank " + std::to_string(comm_.rank()) + " cannot set up its device engine on " +
                      (kind == BufferKind::Cuda ? "cuda:" : "emulated:") + std::to_string(device) +
                      " inside a CUDA graph capture (set-up allocates and meets the peers, which a capture "
                      "forbids): run the collectives once outside the capture first (the warm-up), then "
                      "capture them");
    set_up(kind, device, std::move(d), std::move(poll), what);
    return 1;
  } catch (...) {
    // The one classification (bindings/error_kinds.h): a store's failure keeps its class
    // (RendezvousError, StoreLostError), as the Python route raises it, not RuntimeError.
    *err = classify_error(std::current_exception());
    if (err->kind == kCoreNoMemory) err->message = "out of memory setting up the device engine";
  }
  return -1;
}

}  // namespace commlib
