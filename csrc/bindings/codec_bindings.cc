// The block-wise codecs (kernels/cpu_codecs.h) on NumPy buffers, for commlib.codecs: encode a
// contiguous float32 / float16 / bfloat16 (as uint16) buffer to bytes, decode bytes back; error
// feedback's fused step; and a host collective with compress= (run_compressed).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bindings/bindings.h"
#include "bindings/buffer_view.h"
#include "bindings/gil.h"
#include "host/communicator.h"
#include "plan/call.h"
#include "verify/verifier_codec.h"
#include "kernels/cpu_codecs.h"
#include "kernels/cpu_codecs_reference.h"
#include "kernels/cpu_error_feedback.h"

namespace py = pybind11;

namespace commlib {
namespace {


py::buffer_info contiguous(const char* name, const py::buffer& b, bool writable, DType dtype) {
  py::buffer_info info = b.request(writable);
  if (info.itemsize != static_cast<py::ssize_t>(dtype_size(dtype)))
    throw std::invalid_argument(std::string(name) + ": item size " + std::to_string(info.itemsize) +
                                " does not match dtype " + dtype_name(dtype));
  py::ssize_t expect = info.itemsize;
  for (py::ssize_t i = info.ndim - 1; i >= 0; --i) {
    if (info.shape[i] != 1 && info.strides[i] != expect)
      throw std::invalid_argument(std::string(name) + ": buffer must be contiguous");
    expect *= info.shape[i];
  }
  return info;
}

py::array_t<uint8_t> encode(const std::string& codec, int64_t block, const std::string& rounding, uint64_t seed,
                            DType dtype, const py::buffer& src, uint64_t counter_base, bool reference) {
  const CodecSpec spec = codec_spec_of(codec, block, rounding, seed);
  check_codec(spec, dtype);
  const py::buffer_info s = contiguous("x", src, false, dtype);
  const size_t n = static_cast<size_t>(s.size);
  py::array_t<uint8_t> out(static_cast<py::ssize_t>(codec_encoded_bytes(spec, n)));
  uint8_t* dst = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    (reference ? codec_encode_reference : codec_encode)(spec, dtype, s.ptr, n, dst, counter_base);
  }
  return out;
}

void decode(const std::string& codec, int64_t block, DType dtype, const py::buffer& src, const py::buffer& dst,
            bool reference) {
  CodecSpec spec = codec_spec_of(codec, block, "nearest", 0);
  check_codec(spec, dtype);
  const py::buffer_info d = contiguous("out", dst, true, dtype);
  const py::buffer_info s = src.request(false);
  const size_t n = static_cast<size_t>(d.size);
  const size_t need = codec_encoded_bytes(spec, n);
  if (static_cast<size_t>(s.size * s.itemsize) != need)
    throw std::invalid_argument("data: " + std::to_string(s.size * s.itemsize) + " bytes, but " + std::to_string(n) +
                                " elements of " + codec + " encode to " + std::to_string(need));
  py::gil_scoped_release nogil;
  (reference ? codec_decode_reference : codec_decode)(spec, dtype, static_cast<const uint8_t*>(s.ptr), n, d.ptr);
}

void project(const std::string& codec, int64_t block, const std::string& rounding, uint64_t seed, DType dtype,
             const py::buffer& x, uint64_t counter_base) {
  const CodecSpec spec = codec_spec_of(codec, block, rounding, seed);
  check_codec(spec, dtype);
  const py::buffer_info s = contiguous("x", x, true, dtype);
  std::vector<uint8_t> scratch;
  py::gil_scoped_release nogil;
  codec_project(spec, dtype, s.ptr, static_cast<size_t>(s.size), counter_base, scratch);
}

py::array_t<uint8_t> encode_project(const std::string& codec, int64_t block, const std::string& rounding,
                                    uint64_t seed, DType dtype, const py::buffer& x, uint64_t counter_base) {
  const CodecSpec spec = codec_spec_of(codec, block, rounding, seed);
  check_codec(spec, dtype);
  const py::buffer_info s = contiguous("x", x, true, dtype);
  const size_t n = static_cast<size_t>(s.size);
  py::array_t<uint8_t> out(static_cast<py::ssize_t>(codec_encoded_bytes(spec, n)));
  uint8_t* dst = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    codec_encode_project(spec, dtype, s.ptr, n, dst, counter_base);
  }
  return out;
}

// A float32 host buffer for error_feedback, read by the one buffer reader (a NumPy array; a CPU
// torch.Tensor once commlib.torch registered torch's types).
BufferView host_float32(const char* name, const py::handle& o, PyBufferHold* hold) {
  BufferView v;
  if (o.is_none() || !read_buffer(o.ptr(), &v, hold, false) || v.kind != BufferKind::Host)
    throw py::type_error(std::string(name) + ": a writable, contiguous float32 array on the host, not " +
                         std::string(py::str(py::type::handle_of(o).attr("__name__"))));
  if (v.dtype != DType::Float32)
    throw py::value_error(std::string(name) + ": error feedback keeps float32 gradients and residuals, not " +
                          dtype_name(v.dtype));
  return v;
}

void error_feedback(const std::string& codec, int64_t block, const std::string& rounding, uint64_t seed,
                    const py::handle& grad, const py::handle& residual, uint64_t counter_base, const py::handle& src) {
  const CodecSpec spec = codec_spec_of(codec, block, rounding, seed);
  check_codec(spec, DType::Float32);
  PyBufferHold hg, hr;
  const BufferView g = host_float32("grad", grad, &hg), r = host_float32("residual", residual, &hr);
  if (r.count != g.count)
    throw py::value_error("residual: " + std::to_string(r.count) + " elements, but grad has " + std::to_string(g.count));
  const uintptr_t bytes = static_cast<uintptr_t>(g.count) * 4;
  if (g.count && g.address < r.address + bytes && r.address < g.address + bytes)
    throw py::value_error("residual: overlaps grad (each needs its own memory)");
  PyBufferHold hs;
  const float* from = nullptr;
  if (!src.is_none()) {
    const BufferView v = host_float32("src", src, &hs);
    if (v.count != g.count)
      throw py::value_error("src: " + std::to_string(v.count) + " elements, but grad has " + std::to_string(g.count));
    for (const BufferView* o : {&g, &r})
      if (v.address != g.address && g.count && v.address < o->address + bytes && o->address < v.address + bytes)
        throw py::value_error(std::string("src: overlaps ") + (o == &g ? "grad" : "residual") +
                              " (it is grad itself or memory of its own)");
    from = reinterpret_cast<const float*>(v.address);
  }
  py::gil_scoped_release nogil;
  codec_error_feedback(spec, reinterpret_cast<float*>(g.address), reinterpret_cast<float*>(r.address),
                       static_cast<size_t>(g.count), counter_base, from);
}

std::shared_ptr<Work> run_compressed(Communicator& c, Collective coll, const std::string& algo, uintptr_t in,
                                     uintptr_t out, int64_t count, DType dtype, RedOp op, int root, double scale,
                                     bool async, const std::string& codec, int64_t block, const std::string& rounding,
                                     uint64_t seed, bool inter_only) {
  CollectiveCall call = compressed_collective_call(coll, algo, in, out, count, dtype, op, root, scale, codec, block,
                                                  rounding, seed, inter_only);
  call.codec.piece_bytes = c.codec_piece_bytes();
  ReleaseGil nogil;
  return c.collective(call, async);
}

}  // namespace

CodecSpec codec_spec_of(const std::string& codec, int64_t block, const std::string& rounding, uint64_t seed) {
  CodecSpec s;
  s.kind = codec_kind(codec);
  s.block = block;
  if (rounding != "nearest" && rounding != "stochastic")
    throw std::invalid_argument("rounding: 'nearest' or 'stochastic', got '" + rounding + "'");
  s.stochastic = rounding == "stochastic";
  s.seed = seed;
  return s;
}

CollectiveCall compressed_collective_call(Collective coll, const std::string& algo, uintptr_t in, uintptr_t out,
                                          int64_t count, DType dtype, RedOp op, int root, double scale,
                                          const std::string& codec, int64_t block, const std::string& rounding,
                                          uint64_t seed, bool inter_only) {
  if (coll != Collective::AllReduce && coll != Collective::ReduceScatter && coll != Collective::AllGather)
    throw std::invalid_argument(std::string("compress: all_reduce, reduce_scatter and all_gather take it, not ") +
                                collective_name(coll));
  CollectiveCall call = collective_call(coll, algo, in, out, count, dtype, op, root, scale);
  call.codec = codec_spec_of(codec, block, rounding, seed);
  call.codec.inter_only = inter_only;
  check_codec(call.codec, dtype);
  return call;
}

void bind_codecs(py::module_& m) {
  m.def("codec_encode", &encode, py::arg("codec"), py::arg("block"), py::arg("rounding"), py::arg("seed"),
        py::arg("dtype"), py::arg("x"), py::arg("counter_base") = 0, py::arg("reference") = false,
        "Encode a contiguous float buffer with a block-wise codec; returns the bytes (uint8 array). "
        "reference: through the functors one element at a time (the scalar reference; tests).");
  m.def("codec_decode", &decode, py::arg("codec"), py::arg("block"), py::arg("dtype"), py::arg("data"),
        py::arg("out"), py::arg("reference") = false,
        "Decode codec bytes into `out` (its size is the element count); reference: the scalar functors.");
  m.def("codec_project", &project, py::arg("codec"), py::arg("block"), py::arg("rounding"), py::arg("seed"),
        py::arg("dtype"), py::arg("x"), py::arg("counter_base") = 0,
        "x = decode(encode(x)) in place, as the compressed lowering projects a sum it makes "
        "(kernels/cpu_error_feedback.h: codec_project).");
  m.def("codec_encode_project", &encode_project, py::arg("codec"), py::arg("block"), py::arg("rounding"),
        py::arg("seed"), py::arg("dtype"), py::arg("x"), py::arg("counter_base") = 0,
        "Encode x and replace it with its decoding (a send's encoding and the sender's projection); "
        "returns the bytes (kernels/cpu_codecs.h: codec_encode_project).");
  m.def("codec_error_feedback", &error_feedback, py::arg("codec"), py::arg("block"), py::arg("rounding"),
        py::arg("seed"), py::arg("grad"), py::arg("residual"), py::arg("counter_base") = 0, py::arg("src") = py::none(),
        "Error feedback's step in one pass, in place: s = grad + residual (src + residual with src), "
        "grad = decode(encode(s)), residual = s - grad (float32 host buffers; kernels/cpu_error_feedback.h).");
  m.def("run_compressed", &run_compressed, py::arg("core"), py::arg("collective"), py::arg("algorithm"),
        py::arg("input"), py::arg("output"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("root"),
        py::arg("scale"), py::arg("async_op"), py::arg("codec"), py::arg("block"), py::arg("rounding"),
        py::arg("seed"), py::arg("inter_only") = false,
        "A host collective whose messages travel encoded (docs/compression.md).");
  m.def("verify_compressed", [](Collective c, const std::string& algorithm, int size, int64_t count,
                                bool sender_projects, const std::vector<int>& host_of, bool inter_only) {
        py::gil_scoped_release nogil;
        return verify_compressed(c, algorithm, size, count, sender_projects, host_of, inter_only);
      }, py::arg("collective"), py::arg("algorithm"), py::arg("size"), py::arg("count"),
        py::arg("sender_projects") = true, py::arg("host_of") = std::vector<int>{}, py::arg("inter_only") = false,
        "Verify a schedule as compress= runs it: every rank ends identical (docs/compression.md).");
  m.def("codec_encoded_bytes", [](const std::string& codec, int64_t block, int64_t n) {
        CodecSpec s = codec_spec_of(codec, block, "nearest", 0);
        check_codec(s, DType::Float32);
        if (n < 0) throw std::invalid_argument("count: must be >= 0, got " + std::to_string(n));
        return codec_encoded_bytes(s, static_cast<size_t>(n));
      }, py::arg("codec"), py::arg("block"), py::arg("count"), "Bytes that `count` elements encode to.");
}

}  // namespace commlib
