// `_C.DeviceEngines` (bindings/device_engines.h: the device route's engines, set up through
// device_engine_setup.h's one sequence) and `_C.device_setup_api` (device_setup_api.h: the same for
// C++ callers), over the communicator's store: commlib's own (TCPStore, or SignedStore over one)
// from C++ without the GIL (commlib_setup_store.h); torch's c10d::Store from _C_torch; any other
// store's Python object (PythonSetupStore below), its set/check/get each under the GIL. Every wait,
// check and message is C++, the GIL released between them (a store server may run on a thread of
// this very process).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/commlib_setup_store.h"
#include "bindings/device_call_cache.h"
#include "bindings/device_engine_setup.h"
#include "bindings/device_engines.h"
#include "bindings/device_setup_api.h"
#include "common/types.h"
#include "schedule/registry.h"

namespace py = pybind11;

namespace commlib {

// device_call_new_shape.cc: whether the C++ path runs `call` as a new shape (its argument checks).
bool first_call_runs_from_cpp(const CollectiveCall& call, BufferKind kind_in, BufferKind kind_out, int device,
                              uintptr_t stream, int size);

namespace {

// The store's Python object: set(key, value), check([key]) and get(key), as every store commlib
// meets through has them.
class PythonSetupStore : public SetupStore {
 public:
  explicit PythonSetupStore(py::object store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    calls.fetch_add(1, std::memory_order_relaxed);
    py::gil_scoped_acquire gil;
    store_.attr("set")(key, py::bytes(value));
  }
  bool try_get(const std::string& key, std::string* value) override {
    calls.fetch_add(1, std::memory_order_relaxed);
    py::gil_scoped_acquire gil;
    py::list keys;
    keys.append(key);
    if (!store_.attr("check")(keys).cast<bool>()) return false;
    *value = py::bytes(store_.attr("get")(key)).cast<std::string>();
    return true;
  }

  static std::atomic<uint64_t> calls;

 private:
  py::object store_;
};
std::atomic<uint64_t> PythonSetupStore::calls{0};

// The call that sets the engine up, as the Python route names it (device_route.py `what`).
using FirstCall = std::tuple<Collective, std::string, int64_t, DType, RedOp, int>;
using FirstP2P = std::tuple<std::vector<P2PTuple>, DType>;

// The first call's check while the ranks meet, and its name (device_route.py `what`).
struct FirstCheck {
  std::function<void(StreamEngine&)> poll;
  std::string what;
};
FirstCheck first_check(const std::optional<FirstCall>& first_call, const std::optional<FirstP2P>& first_p2p) {
  if (first_call) {
    const auto& [coll, algo, count, dtype, op, root] = *first_call;
    const bool nccl = algo == "nccl";
    CollectiveCall call = collective_call(coll, nccl ? "auto" : algo, 0, 0, count, dtype, op, root, 1.0);
    if (nccl) call.algo = kNcclAlgorithmCode;
    return {[call](StreamEngine& e) { e.check_first_call(call); }, collective_name(coll)};
  }
  if (first_p2p) {
    const std::vector<P2PItem> items = p2p_items(std::get<0>(*first_p2p));
    const DType dtype = std::get<1>(*first_p2p);
    return {[items, dtype](StreamEngine& e) { e.check_first_p2p(items, dtype); }, "point-to-point"};
  }
  return {[](StreamEngine& e) { e.throw_if_call_failed(UINT64_MAX); }, "set-up"};
}

int set_up_from_cpp(void* cache, const CollectiveCall& call, uint8_t kind, uint8_t kind_out, int device,
                    uintptr_t stream, CoreError* err) {
  std::shared_ptr<DeviceEngines> engines = DeviceEngines::of_cache(cache);
  // A call the C++ path would not run (a bad argument the Python backend names, a form it runs
  // itself) sets nothing up: the hand-over raises before this rank meets its peers.
  if (!engines || !first_call_runs_from_cpp(call, static_cast<BufferKind>(kind), static_cast<BufferKind>(kind_out),
                                            device, stream, engines->world_size()))
    return 0;
  return engines->set_up_for(call, kind, device, stream, err);
}

int set_up_p2p_from_cpp(void* cache, const P2PItem* items, size_t n, DType dtype, uint8_t kind, int device,
                        uintptr_t stream, CoreError* err) {
  std::shared_ptr<DeviceEngines> engines = DeviceEngines::of_cache(cache);
  return engines ? engines->set_up_for_p2p(std::vector<P2PItem>(items, items + n), dtype, kind, device, stream, err)
                 : 0;
}

bool use_store(void* cache, std::shared_ptr<SetupStore> store) {
  std::shared_ptr<DeviceEngines> engines = DeviceEngines::of_cache(cache);
  if (!engines) return false;
  engines->set_store(std::move(store));
  return true;
}

const DeviceSetupApi g_setup_api{2, &set_up_from_cpp, &set_up_p2p_from_cpp, &use_store};

py::tuple engine_tuple(const DeviceEngines::Engine& e) { return py::make_tuple(e.engine, e.device, e.prefix); }

}  // namespace

std::unique_ptr<SetupStore> python_setup_store(py::object store) {
  return std::make_unique<PythonSetupStore>(std::move(store));
}

uint64_t python_setup_store_calls() { return PythonSetupStore::calls.load(std::memory_order_relaxed); }

void bind_device_engine_setup(py::module_& m) {
  bind_commlib_setup_store(m);
  m.def("python_setup_store_calls", &python_setup_store_calls,
        "Store operations the device engine set-ups made through a store's Python object in this process.");
  m.def(
      "device_setup_api", [] { return py::capsule(static_cast<const void*>(&g_setup_api), kDeviceSetupApiCapsule); },
      "The device engine's set-up for other extension modules (bindings/device_setup_api.h), as a capsule.");

  py::class_<DeviceEngines, std::shared_ptr<DeviceEngines>>(m, "DeviceEngines")
      .def(py::init([](py::object comm, py::object store, const std::string& label, double timeout,
                       DeviceCallCache& cache, py::object nccl_setup) {
             auto e = std::make_shared<DeviceEngines>(std::move(comm), std::move(store), label, timeout, &cache,
                                                      std::move(nccl_setup));
             DeviceEngines::register_cache(&cache, e);
             return e;
           }),
           py::arg("comm"), py::arg("store"), py::arg("label"), py::arg("timeout"), py::arg("cache"),
           py::arg("nccl_setup"), py::keep_alive<1, 6>(),
           "The engines of one device route (bindings/device_engines.h), set up by the route or by a C++ caller's "
           "first call (the torch backend) through one sequence; `cache` the route's DeviceCallCache, "
           "`nccl_setup(engine, prefix)` NCCL's communicator where some pair uses it.")
      .def(
          "find",
          [](DeviceEngines& d, int kind, int device) -> py::object {
            DeviceEngines::Engine e;
            if (!d.find(static_cast<BufferKind>(kind), device, &e)) return py::none();
            return engine_tuple(e);
          },
          py::arg("kind"), py::arg("device"), "(engine, device, prefix) of kind:device if set up, else None.")
      .def(
          "set_up",
          [](DeviceEngines& d, int kind, int index, std::shared_ptr<Device> device, std::optional<FirstCall> first_call,
             std::optional<FirstP2P> first_p2p) {
            FirstCheck check = first_check(first_call, first_p2p);
            DeviceEngines::Engine e;
            {
              py::gil_scoped_release nogil;
              e = d.set_up(static_cast<BufferKind>(kind), index, std::move(device), std::move(check.poll), check.what);
            }
            return engine_tuple(e);
          },
          py::arg("kind"), py::arg("device_index"), py::arg("device"), py::arg("first_call") = py::none(),
          py::arg("first_p2p") = py::none(),
          "Sets the engine of kind:device_index up (device_engine_setup.h; NCCL's communicator where needed) and "
          "puts it in the cache: (engine, device, prefix). Raises (the peers told).")
      .def(
          "engines",
          [](DeviceEngines& d) {
            py::list out;
            for (const auto& [k, e] : d.all()) out.append(py::make_tuple(k.first, k.second, engine_tuple(e)));
            return out;
          },
          "Every engine set up so far, in set-up order: (kind, device, (engine, device, prefix)).")
      .def("clear", &DeviceEngines::clear, "Forget the engines (the route closed them).")
      .def("__len__", &DeviceEngines::size, "How many engines are set up.")
      .def("python_store", &DeviceEngines::python_store,
           "Whether the set-ups meet through the store's Python object (False for commlib's own store, "
           "spoken from C++, and once the torch backend gave its c10d::Store).")
      .def(
          "set_cuda",
          [](DeviceEngines& d, py::capsule maker, py::capsule wrapper) {
            if (std::strcmp(maker.name(), kCudaDeviceMakerCapsule) != 0)
              throw std::invalid_argument("maker: not commlib._C_cuda.device_maker()'s capsule");
            if (std::strcmp(wrapper.name(), kCudaStreamWrapperCapsule) != 0)
              throw std::invalid_argument("wrapper: not commlib._C_cuda.stream_wrapper()'s capsule");
            d.set_cuda(reinterpret_cast<CudaDeviceMaker>(maker.get_pointer()),
                       reinterpret_cast<CudaStreamWrapper>(wrapper.get_pointer()));
          },
          py::arg("maker"), py::arg("wrapper"),
          "CUDA for C++ callers' first calls: commlib._C_cuda.device_maker() and stream_wrapper().");
}

}  // namespace commlib
