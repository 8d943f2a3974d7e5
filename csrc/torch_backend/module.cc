// commlib._C_torch: the C++ c10d::Backend of the "commlib" torch backend (torch_backend/backend.h),
// built against the installed torch by setup.py (torch's headers and libraries, its C++ ABI and
// pybind11 flags). commlib/torch/native.py loads it after checking the torch version it was built
// against (COMMLIB_TORCH_VERSION, also recorded beside the module) against the running one.
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <map>
#include <array>
#include <optional>
#include <string>
#include <utility>
#include <tuple>
#include <stdexcept>
#include <vector>

#include "common/alloc_count.h"
#include "torch_backend/argument_errors.h"
#include "torch_backend/backend.h"
#include "torch_backend/process_group.h"
#include "bindings/device_setup_api.h"

namespace py = pybind11;
using commlib::torch_backend::CommlibBackend;
using commlib::torch_backend::kCollectives;

#ifndef COMMLIB_TORCH_VERSION
#error "COMMLIB_TORCH_VERSION: setup.py passes the version of the torch this module is built against"
#endif

namespace commlib {
namespace torch_backend {
void set_device_setup_api(const DeviceSetupApi* api);  // device_setup.cc
bool use_c10d_setup_store(void* cache, c10::intrusive_ptr<c10d::Store> store);  // device_setup.cc
}  // namespace torch_backend
}  // namespace commlib

namespace {

const commlib::CoreApi* core_api() {
  py::object capsule = py::module_::import("commlib._C").attr("core_api")();
  auto* api = static_cast<const commlib::CoreApi*>(PyCapsule_GetPointer(capsule.ptr(), commlib::kCoreApiCapsule));
  if (api == nullptr) throw py::error_already_set();
  if (api->version != commlib::kCoreApiVersion)
    throw std::runtime_error("commlib._C_torch: commlib._C's core API is version " + std::to_string(api->version) +
                             ", this module was built for " + std::to_string(commlib::kCoreApiVersion) +
                             "; rebuild (scripts/setup.sh)");
  return api;
}

}  // namespace

PYBIND11_MODULE(_C_torch, m) {
  m.doc() = "commlib's torch backend as a C++ c10d::Backend (docs/torch_backend.md)";
  py::module_::import("torch.distributed");  // torch's Backend and Work types, registered first
  static const commlib::CoreApi* api = core_api();
  {  // _C's engine set-up, for the first device call on a group and device (device_calls.cc)
    py::object capsule = py::module_::import("commlib._C").attr("device_setup_api")();
    auto* setup = static_cast<const commlib::DeviceSetupApi*>(
        PyCapsule_GetPointer(capsule.ptr(), commlib::kDeviceSetupApiCapsule));
    if (setup == nullptr) throw py::error_already_set();
    commlib::torch_backend::set_device_setup_api(setup);
  }
  commlib::torch_backend::init_error_classes(api);
  m.attr("built_torch_version") = COMMLIB_TORCH_VERSION;

  m.def(
      "_use_c10d_setup_store",
      [](uintptr_t cache, c10::intrusive_ptr<c10d::Store> store) {
        // Without the GIL: a set-up under way holds its lock and may wait for the GIL (a Python store).
        py::gil_scoped_release nogil;
        return commlib::torch_backend::use_c10d_setup_store(reinterpret_cast<void*>(cache), std::move(store));
      },
      py::arg("cache"), py::arg("store"),
      "The device engine set-ups of the route whose call cache is at `cache` meet through `store` (the group's "
      "c10d::Store, which the route's communicator was given) from C++ from now on: no Python at a first call.");

  m.def(
      "_host_tensor",
      [](uintptr_t address, int64_t nbytes) {
        return at::from_blob(reinterpret_cast<void*>(address), {nbytes}, at::TensorOptions().dtype(at::kByte));
      },
      py::arg("address"), py::arg("nbytes"),
      "Test seam: a uint8 CPU tensor over `nbytes` of host-addressable memory at `address` (emulated-device "
      "memory), not owning it: the caller keeps the memory alive.");

  m.def(
      "process_group",
      [](c10::intrusive_ptr<c10d::Store> store, int rank, int size, c10::intrusive_ptr<c10d::Backend> backend,
         const std::vector<c10::Device>& devices, std::optional<c10::Device> bound_device) {
        // Returned as torch's ProcessGroup (CommlibProcessGroup is not registered: pybind11 casts
        // an unregistered subclass to its registered base), see process_group.h.
        c10::intrusive_ptr<c10d::ProcessGroup> pg = c10::make_intrusive<commlib::torch_backend::CommlibProcessGroup>(
            std::move(store), rank, size, backend, devices, bound_device);
        return pg;
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("backend"), py::arg("devices"),
      py::arg("bound_device") = py::none(),
      "The process group of a commlib group: torch's ProcessGroup, set up as _new_process_group_helper sets up "
      "its own (CUSTOM, the bound device, `backend` for each of `devices`), whose getBackendName() is \"commlib\".");

  py::class_<CommlibBackend, c10d::Backend, c10::intrusive_ptr<CommlibBackend>>(m, "CommlibBackend")
      .def(py::init([](py::object group, uintptr_t core, int rank, int size, const std::vector<std::string>& algos,
                       py::object factory) {
             // algos: the algorithm name per collective, in Collective order ("auto" or a name)
             std::array<uint8_t, kCollectives> codes{};
             for (size_t i = 0; i < algos.size() && i < codes.size(); ++i) {
               const int code = api->algorithm_index(static_cast<commlib::Collective>(i), algos[i].c_str());
               if (code < 0) throw py::value_error("algorithms: unknown algorithm " + algos[i]);
               codes[i] = static_cast<uint8_t>(code);
             }
             return c10::make_intrusive<CommlibBackend>(api, std::move(group), core, rank, size, codes,
                                                        std::move(factory));
           }),
           py::arg("group"), py::arg("core_address"), py::arg("rank"), py::arg("size"), py::arg("algorithms"),
           py::arg("factory"),
           "The backend of one group over the Python backend `group` (commlib.torch.backend.ProcessGroupCommlib) "
           "and its communicator's core (_C.core_address).")
      .def_property_readonly("python_group", &CommlibBackend::python_group,
                             "The Python backend of this group (calls this backend hands over, the communicator).")
      .def(
          "_device_collective",
          [](CommlibBackend& b, int coll, int dtype, int64_t count, uintptr_t in, uintptr_t out, int op, int root,
             double scale, bool two_buffers, int device, uintptr_t stream) {
            // The CUDA path's own entry (device_run: the cache lookup through the core's table, the
            // held tensors, CudaWork) on emulated-device memory, which torch's CPU build can stand
            // in for CUDA tensors with: the call as the CUDA path builds it (algorithm auto).
            auto call = commlib::torch_backend::make_call(static_cast<commlib::Collective>(coll), 0,
                                                          static_cast<commlib::DType>(dtype), count, in, out, root);
            call.op = static_cast<commlib::RedOp>(op);
            call.scale = scale;
            const c10::Stream host(c10::Stream::DEFAULT, c10::Device(c10::kCPU));  // (no c10 stream to wait on)
            c10::intrusive_ptr<c10d::Work> work;
            {
              py::gil_scoped_release nogil;  // as torch's dispatcher calls the backend
              work = b.device_run(call, commlib::torch_backend::kEmulatedBuffer, two_buffers, device, stream, host,
                                  c10d::OpType::UNKNOWN, "device call", {}, {});
            }
            return work ? py::cast(work) : py::none();
          },
          py::arg("collective"), py::arg("dtype"), py::arg("count"), py::arg("input"), py::arg("output"),
          py::arg("op"), py::arg("root"), py::arg("scale"), py::arg("two_buffers"), py::arg("device"),
          py::arg("stream"),
          "Test seam: a call on emulated-device memory through the CUDA path's entry; its Work (torch's), or None "
          "when the device call cache does not hold it (the CUDA path then hands the call to the Python backend).")
      .def(
          "_device_collective_steady",
          [](CommlibBackend& b, int n, int kept, int coll, int dtype, int64_t count, uintptr_t in, uintptr_t out,
             bool two_buffers, int device, uintptr_t stream) {
            // n calls through the CUDA path's entry as _device_collective makes them (sum), the
            // caller holding the last `kept` works as a training step holds its buckets' (after
            // 2 * kept calls held alike), counted in C++ so that only the backend's own work is:
            // (heap allocations of _C_torch's code on this thread in the n calls, calls run).
            auto call = commlib::torch_backend::make_call(static_cast<commlib::Collective>(coll), 0,
                                                          static_cast<commlib::DType>(dtype), count, in, out, 0);
            const c10::Stream host(c10::Stream::DEFAULT, c10::Device(c10::kCPU));
            std::vector<c10::intrusive_ptr<c10d::Work>> held(static_cast<size_t>(std::max(kept, 1)));
            size_t at = 0;
            int ran = 0;
            uint64_t allocations = 0;
            {
              py::gil_scoped_release nogil;
              auto one = [&] {
                auto w = b.device_run(call, commlib::torch_backend::kEmulatedBuffer, two_buffers, device, stream,
                                      host, c10d::OpType::UNKNOWN, "device call", at::Tensor(), at::Tensor());
                if (w) ++ran;
                held[at] = std::move(w);  // (the work it replaces is let go of: the pool may re-arm it)
                at = (at + 1) % held.size();
              };
              for (int i = 0; i < 2 * kept; ++i) one();
              ran = 0;
              for (int i = 0; i < n; ++i) {
                const uint64_t before = commlib::thread_allocations();
                one();
                allocations += commlib::thread_allocations() - before;
                // One call in flight at a time (its synchronize uncounted): the works referenced are
                // the kept ones and the one in hand, as in the warm-up, whatever the host's lead
                // over the device would otherwise be (the pool and queues grew with that lead).
                const auto& newest = held[(at + held.size() - 1) % held.size()];
                if (newest) newest->synchronize();
              }
              for (auto& w : held)
                if (w) w->synchronize();
              held.clear();  // (released without the GIL, as torch's holders release theirs)
            }
            return std::make_tuple(allocations, ran);
          },
          py::arg("n"), py::arg("kept"), py::arg("collective"), py::arg("dtype"), py::arg("count"), py::arg("input"),
          py::arg("output"), py::arg("two_buffers"), py::arg("device"), py::arg("stream"),
          "Test seam: n steady sum calls on emulated-device memory through the CUDA path's entry, the last `kept` "
          "works held; (heap allocations of this module's code on this thread in the n calls, calls run from C++).")
      .def_property_readonly("_host_p2p_batches", &CommlibBackend::host_p2p_batches,
                             "Batches of held host sends and receives issued to the core (for tests).")
      .def_property_readonly("_blocking_works_made", &CommlibBackend::blocking_works_made,
                             "Works of blocking calls made rather than reused (for tests).")
      .def("_device_works_pooled", &CommlibBackend::device_works_pooled,
           "CudaWorks the backend's pool keeps (re-armed for later calls once nothing references them).")
      .def(
          "_device_p2p",
          [](CommlibBackend& b, const std::vector<std::tuple<bool, uintptr_t, int64_t, int>>& messages, int device,
             uintptr_t stream) {
            // The CUDA path's sends and receives (held back, issued as the engine's batches through
            // the core's table) on emulated-device memory: (send, address, bytes, peer) each, called
            // on the stream `stream` (the emulated current stream's identity).
            const c10::Stream host(c10::Stream::DEFAULT, c10::Device(c10::kCPU));  // (no c10 stream to wait on)
            std::vector<c10::intrusive_ptr<c10d::Work>> works;
            for (const auto& [send, address, bytes, peer] : messages) {
              at::Tensor t = at::from_blob(reinterpret_cast<void*>(address), {bytes},
                                           at::TensorOptions().dtype(at::kByte));
              py::gil_scoped_release nogil;  // as torch's dispatcher calls the backend
              works.push_back(b.hold_device_message(send, t, peer, commlib::torch_backend::kEmulatedBuffer, device,
                                                    stream, host));
            }
            return works;
          },
          py::arg("messages"), py::arg("device"), py::arg("stream"),
          "Test seam: sends and receives ((send, address, bytes, peer) each) of emulated-device memory through the "
          "CUDA path's hold and batches; their Works (torch's). A batch on a stream the device route has run "
          "nothing on fails (the CUDA path runs it through the Python path instead).")
      .def(
          "_device_exchange",
          [](CommlibBackend& b, uintptr_t in, uintptr_t out, const std::vector<int64_t>& in_bytes,
             const std::vector<int64_t>& out_bytes, int device, uintptr_t stream) {
            // The CUDA path's uneven all_to_all_single (device_exchange) on emulated-device memory.
            // The own block is copied by the host here (no c10 stream): synchronize the stream first.
            int64_t n_in = 0, n_out = 0;
            for (int64_t x : in_bytes) n_in += x;
            for (int64_t x : out_bytes) n_out += x;
            auto bytes = at::TensorOptions().dtype(at::kByte);
            at::Tensor ti = at::from_blob(reinterpret_cast<void*>(in), {n_in}, bytes);
            at::Tensor to = at::from_blob(reinterpret_cast<void*>(out), {n_out}, bytes);
            const c10::Stream host(c10::Stream::DEFAULT, c10::Device(c10::kCPU));
            py::gil_scoped_release nogil;
            return b.device_exchange(ti, to, in_bytes, out_bytes, commlib::DType::UInt8,
                                     commlib::torch_backend::kEmulatedBuffer, device,
                                     stream, host, at::Tensor());
          },
          py::arg("input"), py::arg("output"), py::arg("input_bytes"), py::arg("output_bytes"), py::arg("device"),
          py::arg("stream"),
          "Test seam: an uneven all_to_all of emulated-device memory (bytes per rank each way) through the CUDA "
          "path's batch; its Work (torch's).")
      .def(
          "_device_list_call",
          [](CommlibBackend& b, const std::string& kind, const std::vector<std::pair<uintptr_t, int64_t>>& ins,
             const std::vector<std::pair<uintptr_t, int64_t>>& outs, int root, int device, uintptr_t stream) {
            // The CUDA path's gather, scatter and list all_to_all (their batches, device_batch) on
            // emulated-device memory, (address, bytes) per block: gather's input and the root's
            // list (outs), scatter's root list (ins) and output, all_to_all's lists. The own block
            // is copied by the host here (no c10 stream): synchronize the stream first.
            namespace tb = commlib::torch_backend;
            auto blocks = [](const std::vector<std::pair<uintptr_t, int64_t>>& v) {
              std::vector<at::Tensor> ts;
              for (const auto& [address, bytes] : v)
                ts.push_back(at::from_blob(reinterpret_cast<void*>(address), {bytes},
                                           at::TensorOptions().dtype(at::kByte)));
              return ts;
            };
            const std::vector<at::Tensor> in = blocks(ins), out = blocks(outs);
            const int me = b.getRank();
            tb::DeviceBatch batch;
            c10d::OpType type = c10d::OpType::ALLTOALL;
            if (kind == "gather") {
              batch = tb::rooted_batch(in.at(0), out, root, me, true);
              type = c10d::OpType::GATHER;
            } else if (kind == "scatter") {
              batch = tb::rooted_batch(out.at(0), in, root, me, false);
              type = c10d::OpType::SCATTER;
            } else if (kind == "all_to_all") {
              batch = tb::alltoall_batch(out, in, me);
            } else {
              throw py::value_error("kind: gather, scatter or all_to_all, not " + kind);
            }
            const c10::Stream host(c10::Stream::DEFAULT, c10::Device(c10::kCPU));
            py::gil_scoped_release nogil;  // as torch's dispatcher calls the backend
            return b.device_batch(std::move(batch), type, "device list call", out, tb::kEmulatedBuffer, device,
                                  stream, host);
          },
          py::arg("kind"), py::arg("inputs"), py::arg("outputs"), py::arg("root"), py::arg("device"),
          py::arg("stream"),
          "Test seam: gather, scatter or a list all_to_all of emulated-device memory ((address, bytes) per block) "
          "as the CUDA path's one batch; its Work (torch's).")
      .def(
          "_while_holding_p2p",
          [](CommlibBackend& b, py::function f) {
            // What python_batch does: the hold's mutex, then the GIL (for `f`).
            b.while_p2p_locked([&f] {
              py::gil_scoped_acquire gil;
              f();
            });
          },
          py::arg("f"),
          "Test seam: calls f (under the GIL) while holding the mutex a flush of held sends and receives holds, as "
          "a CUDA batch that goes through Python does.")
      .def(
          "_staged_device_call",
          [](CommlibBackend& b, const std::string& kind, const std::vector<at::Tensor>& outs,
             const std::vector<at::Tensor>& ins, const std::string& op, int root, int device, uintptr_t stream,
             py::function alloc) {
            // The CUDA path's staged calls (staging.h's builders, device_staged: device_staged.cc) on
            // host views of emulated-device memory (_host_tensor), the staged buffers emulated
            // memory too (`alloc(nbytes)`: an emulated array, kept alive by the buffer). The copies
            // in run on the host here: synchronize the stream first.
            namespace tb = commlib::torch_backend;
            tb::StageOn on;
            on.alloc = [alloc](at::IntArrayRef sizes, const at::TensorOptions& o) {
              const int64_t n = c10::multiply_integers(sizes) * static_cast<int64_t>(o.dtype().itemsize());
              auto* array = new py::object(alloc(std::max<int64_t>(n, 1)));  // (under the GIL: the builder's)
              const uintptr_t at_address = array->attr("data_ptr")().cast<uintptr_t>();
              return at::from_blob(
                  reinterpret_cast<void*>(at_address), sizes,
                  [array](void*) {
                    py::gil_scoped_acquire gil;
                    delete array;
                  },
                  o);
            };
            static const std::map<std::string, c10d::ReduceOp::RedOpType> ops = {
                {"sum", c10d::ReduceOp::SUM}, {"avg", c10d::ReduceOp::AVG}, {"product", c10d::ReduceOp::PRODUCT},
                {"min", c10d::ReduceOp::MIN}, {"max", c10d::ReduceOp::MAX}, {"band", c10d::ReduceOp::BAND},
                {"bor", c10d::ReduceOp::BOR}, {"bxor", c10d::ReduceOp::BXOR}};
            const c10d::ReduceOp red(ops.at(op));
            const int me = b.getRank(), P = b.getSize();
            tb::StagedCall s;
            bool two = true, ok = false;
            c10d::OpType type = c10d::OpType::UNKNOWN;
            std::vector<at::Tensor> outputs = outs;
            if (kind == "all_reduce" || kind == "reduce") {
              two = false;
              const auto c = kind == "all_reduce" ? commlib::Collective::AllReduce : commlib::Collective::Reduce;
              ok = tb::stage_reduction(on, c, ins.at(0), red, root, me, P, 0, &s);
              outputs = ins;
            } else if (kind == "broadcast") {
              two = false;
              ok = tb::stage_broadcast(on, ins.at(0), root, me, P, 0, &s);
              outputs = ins;
            } else if (kind == "reduce_scatter_tensor") {
              ok = tb::stage_reduce_scatter_base(on, outs.at(0), ins.at(0), red, P, 0, &s);
            } else if (kind == "reduce_scatter") {
              ok = tb::stage_reduce_scatter_list(on, outs.at(0), ins, red, P, me, 0, &s);
            } else if (kind == "all_gather_into_tensor") {
              ok = tb::stage_allgather_base(on, outs.at(0), ins.at(0), P, 0, &s);
            } else if (kind == "all_gather") {
              ok = tb::stage_allgather_list(on, outs, ins.at(0), P, 0, &s) ||
                   tb::stage_allgather_uneven(on, outs, ins.at(0), P, me, 0, &s);
            } else if (kind == "all_to_all_single") {
              ok = tb::stage_alltoall_base(on, outs.at(0), ins.at(0), P, 0, &s);
            } else {
              throw py::value_error("kind: not a staged collective: " + kind);
            }
            if (!ok) {  // declined: what the backend's method raises next (argument_errors.h), else None
              const auto& o0 = outs.empty() ? at::Tensor() : outs[0];
              if (kind == "all_reduce") tb::refuse_reduction(ins.at(0), red);
              if (kind == "reduce") tb::refuse_reduction(ins.at(0), red, true, root, P);
              if (kind == "broadcast") tb::refuse_root(root, P);
              if (kind == "reduce_scatter_tensor") tb::refuse_reduce_scatter_base(o0, ins.at(0), red, P);
              if (kind == "reduce_scatter") tb::refuse_reduce_scatter_list(o0, ins, red, P, me);
              if (kind == "all_gather_into_tensor") tb::refuse_allgather_base(o0, ins.at(0), P);
              if (kind == "all_gather") tb::refuse_allgather_list({outs}, {ins.at(0)}, P, me);
              if (kind == "all_to_all_single") tb::refuse_alltoall_base(o0, ins.at(0), true, true, P);
              return py::object(py::none());
            }
            const c10::Stream host(c10::Stream::DEFAULT, c10::Device(c10::kCPU));  // (no c10 stream to wait on)
            c10::intrusive_ptr<c10d::Work> work;
            {
              py::gil_scoped_release nogil;  // as torch's dispatcher calls the backend
              work = b.device_staged(std::move(s), tb::kEmulatedBuffer, two, device, stream, host, type,
                                     "staged device call", outputs);
            }
            return work ? py::cast(work) : py::object(py::none());
          },
          py::arg("kind"), py::arg("outputs"), py::arg("inputs"), py::arg("op"), py::arg("root"), py::arg("device"),
          py::arg("stream"), py::arg("alloc"),
          "Test seam: a staged collective (kind: all_reduce, reduce, broadcast, all_gather (even or uneven), "
          "all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, all_to_all_single) of host views of "
          "emulated-device memory through the CUDA path's staging and device entry; its Work (torch's), or None "
          "when the builder or the device entry declined; a builder's decline for a bad argument raises what the "
          "backend's method raises then (argument_errors.h).")
      .def("_device_calls_held", &CommlibBackend::device_calls_held,
           "Device calls whose tensors the backend still holds (not seen retired), for tests.");
}
