// `_C.set_up_device_engine`: the device route's engine set-up (commlib/core/device_route.py
// `_engine`) runs device_engine_setup.h's one implementation, over the communicator's Python store
// (commlib's TCPStore, SignedStore, or the store torch gave the group): only the store's own
// set/check/get are Python, each under the GIL; every wait, check and message is C++, the GIL
// released between them (a store server may run on a thread of this very process).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <tuple>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/device_engine_setup.h"
#include "bindings/gil.h"
#include "common/types.h"
#include "schedule/registry.h"

namespace py = pybind11;

namespace commlib {
namespace {

// The store's Python object: set(key, value), check([key]) and get(key), as every store commlib
// meets through has them.
class PythonSetupStore : public SetupStore {
 public:
  explicit PythonSetupStore(py::object store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    py::gil_scoped_acquire gil;
    store_.attr("set")(key, py::bytes(value));
  }
  bool try_get(const std::string& key, std::string* value) override {
    py::gil_scoped_acquire gil;
    py::list keys;
    keys.append(key);
    if (!store_.attr("check")(keys).cast<bool>()) return false;
    *value = py::bytes(store_.attr("get")(key)).cast<std::string>();
    return true;
  }

 private:
  py::object store_;
};

// The call that sets the engine up, as the Python route names it (device_route.py `what`).
using FirstCall = std::tuple<Collective, std::string, int64_t, DType, RedOp, int>;
using FirstP2P = std::tuple<std::vector<P2PTuple>, DType>;

}  // namespace

void bind_device_engine_setup(py::module_& m) {
  m.def(
      "set_up_device_engine",
      [](Communicator& comm, std::shared_ptr<Device> device, double timeout, const std::string& label,
         const std::string& prefix, py::object store, std::optional<FirstCall> first_call,
         std::optional<FirstP2P> first_p2p) {
        DeviceEngineSetup s{comm, std::move(device), timeout, label, prefix, nullptr, "set-up"};
        if (first_call) {
          const auto& [coll, algo, count, dtype, op, root] = *first_call;
          const bool nccl = algo == "nccl";
          CollectiveCall call = collective_call(coll, nccl ? "auto" : algo, 0, 0, count, dtype, op, root, 1.0);
          if (nccl) call.algo = kNcclAlgorithmCode;
          s.poll = [call](StreamEngine& e) { e.check_first_call(call); };
          s.what = collective_name(coll);
        } else if (first_p2p) {
          const std::vector<P2PItem> items = p2p_items(std::get<0>(*first_p2p));
          const DType dtype = std::get<1>(*first_p2p);
          s.poll = [items, dtype](StreamEngine& e) { e.check_first_p2p(items, dtype); };
          s.what = "point-to-point";
        } else {
          s.poll = [](StreamEngine& e) { e.throw_if_call_failed(UINT64_MAX); };
        }
        PythonSetupStore py_store(std::move(store));
        ReleaseGil nogil;
        return set_up_device_engine(s, py_store);
      },
      py::arg("comm"), py::arg("device"), py::arg("timeout"), py::arg("label"), py::arg("prefix"), py::arg("store"),
      py::arg("first_call") = py::none(), py::arg("first_p2p") = py::none(), py::keep_alive<0, 1>(),
      "The stream engine of `device` on `comm`, set up with every rank through `store` under `prefix` "
      "(bindings/device_engine_setup.h): handles exchanged, COMMLIB_DEVICE_LINK agreed, connected. "
      "`first_call` (collective, algorithm, count, dtype, op, root) or `first_p2p` (items, dtype): the call "
      "that sets it up, checked against the peers' while they meet (MismatchError for a peer in a host call). "
      "NCCL's communicator is the caller's (commlib/device/nccl_comm.py).");
}

}  // namespace commlib
