// `_C.DeviceCallCache` (bindings/device_call_cache.h) and the counts tests read of it.
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "bindings/bindings.h"
#include "bindings/device_call_cache.h"
#include "device/emulated/emulated_device.h"

namespace py = pybind11;

namespace commlib {

// A named function the bench calls between its phases (bench/launch_cost.py): callgrind's
// --dump-before on it splits a run's instruction counts by phase. It does nothing.
__attribute__((noinline)) void callgrind_phase_mark() { __asm__ volatile(""); }

void bind_device_call_cache(py::module_& m) {
  py::class_<DeviceCallCache, std::unique_ptr<DeviceCallCache>>(
      m, "DeviceCallCache", "Resolved device collectives of one route, for the C++ entry (bindings/device_call_cache.h).")
      .def(py::init<int, int, py::object>(), py::arg("size"), py::arg("rank"), py::arg("make_work"))
      .def(
          "add",
          [](DeviceCallCache& c, py::handle a, py::handle b, py::handle op, py::handle algorithm, py::handle root,
             py::handle scale, py::handle stream, std::shared_ptr<StreamEngine> engine, Collective coll,
             const std::string& algo, uintptr_t in, uintptr_t out, int64_t count, DType dtype, RedOp red, int root_value,
             double scale_value, std::shared_ptr<DeviceStream> device_stream, py::object stream_of,
             py::handle compress, py::object codec) {
            // (algorithm="nccl" as engine.run reads it: NCCL's own collective, device_bindings.cc)
            const bool nccl = algo == "nccl";
            CollectiveCall call;
            if (!codec.is_none()) {  // engine.run_compressed's call (device_codec_bindings.cc)
              const auto [name, block, rounding, seed, inter_only] =
                  py::cast<std::tuple<std::string, int64_t, std::string, uint64_t, bool>>(codec);
              call = compressed_collective_call(coll, algo, in, out, count, dtype, red, root_value, scale_value, name,
                                                block, rounding, seed, inter_only);
              call.codec.piece_bytes = engine->codec_piece_bytes();
            } else {
              call = collective_call(coll, nccl ? "auto" : algo, in, out, count, dtype, red, root_value, scale_value);
              if (nccl) call.algo = kNcclAlgorithmCode;
            }
            return c.add(a, b, op, algorithm, root, scale, stream, std::move(engine), call, std::move(device_stream),
                         std::move(stream_of), compress);
          },
          py::arg("a"), py::arg("b"), py::arg("op"), py::arg("algorithm"), py::arg("root"), py::arg("scale"),
          py::arg("stream"), py::arg("engine"), py::arg("collective"), py::arg("algo"), py::arg("input"),
          py::arg("output"), py::arg("count"), py::arg("dtype"), py::arg("red"), py::arg("root_value"),
          py::arg("scale_value"), py::arg("device_stream"), py::arg("stream_of"), py::arg("compress") = py::none(),
          py::arg("codec") = py::none(),
          "add(a, b, op, algorithm, root, scale, stream, engine, *engine.run's arguments, stream_of[, compress, "
          "codec]): after the call ran, later calls of the same arguments (as the entry reads them) hit. compress: "
          "the call's compress= object as given, codec: (name, block, rounding, seed, inter_only) of the Codec it "
          "resolved to (engine.run_compressed's call; `algo` the algorithm resolved for it). False when not "
          "cacheable.")
      .def(
          "add_stream",
          [](DeviceCallCache& c, int kind, int device, std::shared_ptr<StreamEngine> engine,
             std::shared_ptr<DeviceStream> stream) {
            return c.streams().add_current(static_cast<BufferKind>(kind), device, std::move(engine), std::move(stream));
          },
          py::arg("kind"), py::arg("device"), py::arg("engine"), py::arg("stream"),
          "After a point-to-point batch on this thread's current stream of device kind:device (2 emulated, 3 "
          "CUDA): C++ callers' batches on that stream run on `engine`. False for a kind without a current stream.")
      .def(
          "add_engine",
          [](DeviceCallCache& c, int kind, int device, std::shared_ptr<StreamEngine> engine, py::object stream_of,
             py::object wrapper) {
            DeviceP2PStreams::Wrap wrap;
            if (static_cast<BufferKind>(kind) == BufferKind::Emulated) {
              std::shared_ptr<EmulatedDevice> d = std::dynamic_pointer_cast<EmulatedDevice>(engine->shared_device());
              if (!d) throw std::invalid_argument("engine: not on the emulated device");
              wrap = [d](uintptr_t id) { return d->stream_named(id); };
            } else if (static_cast<BufferKind>(kind) == BufferKind::Cuda) {
              py::capsule cap = py::reinterpret_borrow<py::capsule>(wrapper);
              if (std::strcmp(cap.name(), kCudaStreamWrapperCapsule) != 0)
                throw std::invalid_argument("wrapper: not commlib._C_cuda.stream_wrapper()'s capsule");
              const auto fn = reinterpret_cast<CudaStreamWrapper>(cap.get_pointer());
              wrap = [fn, device](uintptr_t stream) { return fn(device, stream); };
            } else {
              throw std::invalid_argument("kind: 2 (emulated) or 3 (CUDA)");
            }
            c.add_engine(static_cast<BufferKind>(kind), device, std::move(engine), std::move(wrap), std::move(stream_of));
          },
          py::arg("kind"), py::arg("device"), py::arg("engine"), py::arg("stream_of"), py::arg("wrapper") = py::none(),
          "After the route set up `engine` for device kind:device (2 emulated, 3 CUDA): calls on a stream of that "
          "device no call of the route ran on run from C++ too, the stream wrapped in C++ (CUDA: `wrapper`, "
          "commlib._C_cuda.stream_wrapper()), and new shapes through the Python entry (`stream_of`: the route's "
          "stream resolver of the device, for their works).")
      .def("clear", &DeviceCallCache::clear, "Forget every call and the last engine; release the buffers held.")
      .def("forget", &DeviceCallCache::forget, "Forget every call (the buffers stay held).")
      .def("hold", &DeviceCallCache::hold, py::arg("work"), py::arg("refs"),
           "Hold refs until work completed (polled on every call of either path).")
      .def("held", &DeviceCallCache::held, "Calls whose buffers are held (not seen completed yet).")
      .def("__len__", &DeviceCallCache::size)
      .def("new_shapes", &DeviceCallCache::new_shapes,
           "Calls C++ callers resolved and ran themselves (shapes the Python path never ran), kept for later calls.")
      .def_readwrite("last_engine", &DeviceCallCache::last_engine, "The engine of the last call run (None before).")
      .def("address", [](DeviceCallCache& c) { return reinterpret_cast<uintptr_t>(&c); },
           "For fast_collective (the caller keeps the cache alive).");
  m.def("callgrind_phase_mark", &callgrind_phase_mark,
        "Does nothing: bench/launch_cost.py calls it between phases, callgrind dumps before it.");
  m.def(
      "device_fast_path_counts", [] { return std::make_pair(DeviceCallCounts::offers, DeviceCallCounts::hits); },
      "(device calls offered to the C++ entry's cache, how many of them it ran) in this process, for tests.");
  m.def(
      "device_all_to_allv_count", [] { return DeviceCallCounts::all_to_allv; },
      "all_to_all calls with split sizes the C++ entry ran itself (a point-to-point batch on an engine the route "
      "set up; apart from device_fast_path_counts), in this process, for tests.");
  m.def(
      "device_fast_path_new_shape_count", [] { return DeviceCallCounts::new_shapes; },
      "Of the calls the C++ entry ran (device_fast_path_counts' second), those of a shape the Python path never "
      "ran (checked and resolved in C++ on an engine the route set up), in this process, for tests.");
  m.def(
      "device_native_counts",
      [] { return std::make_pair(DeviceCallCounts::native_offers.load(), DeviceCallCounts::native_hits.load()); },
      "(device calls C++ callers offered the caches without Python: the torch backend's CUDA tensors; how many "
      "of them ran) in this process, for tests.");
  m.def(
      "device_native_new_shape_count", [] { return DeviceCallCounts::native_new_shapes.load(); },
      "Of the C++ callers' calls that ran, those of a shape the Python path never ran (checked and resolved in "
      "C++ on an engine and stream the route set up), in this process, for tests.");
  m.def(
      "device_native_stream_count", [] { return DeviceStreamCounts::wrapped.load(); },
      "Streams the call caches wrapped in C++ (a stream of a set-up engine no call of the route ran on), in this "
      "process, for tests.");
  m.def(
      "device_native_p2p_count", [] { return DeviceCallCounts::native_p2p.load(); },
      "Point-to-point batches C++ callers (the torch backend's CUDA sends and receives) enqueued on a device "
      "stream without Python, in this process, for tests.");
}

}  // namespace commlib
