// The codecs of compress= on a device's memory (Device::codec_encode / codec_decode, the kernels
// of kernels/codec_kernel.h), bound on commlib._C.Device for tests and tools: the emulated
// device's and a CUDA device's (arriving as a capsule) alike; and StreamEngine.run_compressed, a
// collective on device buffers whose messages travel encoded (stream/copy_path_codec.cc); and
// Device.allocate_ordered, the stream-ordered memory of error feedback's temporary on device
// buffers (core/device_feedback.py: no cudaFree, which waits for the device, per bucket).
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "bindings/bindings.h"
#include "bindings/gil.h"
#include "device/device.h"
#include "kernels/cpu_codecs.h"
#include "stream/stream_engine.h"

namespace py = pybind11;

namespace commlib {

void bind_device_codecs(py::module_& m) {
  auto device = py::reinterpret_borrow<py::class_<Device, std::shared_ptr<Device>>>(m.attr("Device"));
  device.def(
      "allocate_ordered",
      [](Device& d, size_t bytes, DeviceStream& s) {
        DeviceGuard g(d);
        return reinterpret_cast<uintptr_t>(d.allocate_ordered(bytes, s));
      },
      py::arg("bytes"), py::arg("stream"),
      "Stream-ordered memory (cudaMallocAsync): usable by work enqueued on `stream` after the call; free it "
      "with free_ordered. Neither waits for the device.");
  device.def(
      "codec_encode",
      [](Device& d, uintptr_t dst, uintptr_t src, size_t n, DType dtype, const std::string& codec, int64_t block,
         const std::string& rounding, uint64_t seed, uint64_t counter_base, DeviceStream& s, uintptr_t stop) {
        const CodecSpec spec = codec_spec_of(codec, block, rounding, seed);
        DeviceGuard g(d);
        d.codec_encode(reinterpret_cast<const uint64_t*>(stop), spec, dtype, reinterpret_cast<const void*>(src), n,
                       reinterpret_cast<void*>(dst), counter_base, s);
      },
      py::arg("dst"), py::arg("src"), py::arg("n"), py::arg("dtype"), py::arg("codec"), py::arg("block"),
      py::arg("rounding"), py::arg("seed"), py::arg("counter_base"), py::arg("stream"), py::arg("stop") = 0,
      "Enqueue dst = encode(src[0, n)) on the stream (codec_encoded_bytes(n) bytes at dst).");
  device.def(
      "codec_decode",
      [](Device& d, uintptr_t dst, uintptr_t src, size_t n, DType dtype, const std::string& codec, int64_t block,
         DeviceStream& s, uintptr_t stop) {
        const CodecSpec spec = codec_spec_of(codec, block, "nearest", 0);
        DeviceGuard g(d);
        d.codec_decode(reinterpret_cast<const uint64_t*>(stop), spec, dtype, reinterpret_cast<const void*>(src), n,
                       reinterpret_cast<void*>(dst), s);
      },
      py::arg("dst"), py::arg("src"), py::arg("n"), py::arg("dtype"), py::arg("codec"), py::arg("block"),
      py::arg("stream"), py::arg("stop") = 0, "Enqueue dst[0, n) = decode(src) on the stream.");

  auto engine = py::reinterpret_borrow<py::class_<StreamEngine, std::shared_ptr<StreamEngine>>>(m.attr("StreamEngine"));
  engine.def(
      "run_compressed",
      [](StreamEngine& e, Collective coll, const std::string& algo, uintptr_t in, uintptr_t out, int64_t count,
         DType dtype, RedOp op, int root, double scale, const std::string& codec, int64_t block,
         const std::string& rounding, uint64_t seed, bool inter_only, DeviceStream& stream) {
        CollectiveCall call = compressed_collective_call(coll, algo, in, out, count, dtype, op, root, scale, codec,
                                                         block, rounding, seed, inter_only);
        call.codec.piece_bytes = e.codec_piece_bytes();  // the host's pieces (in the descriptor: every rank's)
        ReleaseGil nogil;
        return e.collective(call, stream);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("input"), py::arg("output"), py::arg("count"),
      py::arg("dtype"), py::arg("op"), py::arg("root"), py::arg("scale"), py::arg("codec"), py::arg("block"),
      py::arg("rounding"), py::arg("seed"), py::arg("inter_only"), py::arg("stream"),
      "Enqueue a collective whose messages travel encoded (docs/compression.md, device buffers).");
}

}  // namespace commlib
