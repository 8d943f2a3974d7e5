// The key of one cached device call (bindings/device_call_cache.h): everything the Python path's
// checks looked at when the call was added, so a hit is a call those checks already accepted. The
// call as fast_call.cc's call_of reads it from the arguments (collective, requested algorithm,
// addresses, count, dtype, op, root, premul_sum's scale), both buffers' kinds and devices, the
// identity of the stream it runs on (the current one, the one named, stream=, read in C++ as the
// route's resolver reads it: bindings/named_stream.cc, or the one its buffer names) and the stream
// the first buffer names itself, if it does (a __cuda_array_interface__'s: the call's work handle
// orders wait() after that one, as the route's resolver of that buffer does), and the compress=
// object given.
#pragma once

#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "bindings/buffer_view.h"
#include "bindings/fast_call.h"
#include "plan/call.h"
#include "plan/describe.h"

namespace commlib {

struct CallKey {
  CollectiveCall call;  // as call_of reads it (the requested algorithm)
  BufferKind kind_a = BufferKind::None, kind_b = BufferKind::None;
  int device_a = -1, device_b = -1;
  // The identity of the stream the call runs on: the caller's current one, the one named
  // (stream=) or the one its buffer names (own_stream), as DeviceStreamKey names streams.
  uintptr_t current_stream = 0;
  bool own = false;            // the first buffer names its own stream (BufferView::own_stream) ...
  uintptr_t own_stream = 0;    // ... this one
  // compress=: the object given (a codec's name or a frozen commlib.codecs.Codec; the entry holds
  // a reference, so its identity cannot be reused), null for none. Only the route adds such calls.
  PyObject* codec = nullptr;

  bool operator==(const CallKey& o) const {
    const CollectiveCall &x = call, &y = o.call;
    return x.coll == y.coll && x.algo == y.algo && x.input == y.input && x.output == y.output && x.count == y.count &&
           x.dtype == y.dtype && x.op == y.op && x.root == y.root && x.scale == y.scale && kind_a == o.kind_a &&
           kind_b == o.kind_b && device_a == o.device_a && device_b == o.device_b &&
           current_stream == o.current_stream && own == o.own && own_stream == o.own_stream && codec == o.codec;
  }
};

struct CallKeyHash {
  size_t operator()(const CallKey& k) const {
    size_t h = std::hash<uintptr_t>()(k.call.input);
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    mix(std::hash<uintptr_t>()(k.call.output));
    mix(std::hash<int64_t>()(k.call.count));
    mix(std::hash<uintptr_t>()(k.current_stream ^ (k.own_stream << 1) ^ k.own ^ reinterpret_cast<uintptr_t>(k.codec)));
    mix(static_cast<size_t>(k.call.coll) * 131 + static_cast<size_t>(k.call.dtype) * 31 +
        static_cast<size_t>(k.call.op) * 7 + k.call.algo * 1009 + static_cast<size_t>(k.call.root) * 17 +
        static_cast<size_t>(k.device_a + 1) * 3);
    return h;
  }
};

// The key of one call through the Python entry; false when its arguments are not a plain call.
// `named`: the identity of the stream the call names (read_named_stream), null for none (the
// buffers' view holds the current stream's or their own).
// algorithm="nccl" (NCCL's own collective, device buffers only: the name table, which the host path
// reads too, does not know it) is read here, as the route's engine.run reads it.
inline bool key_of(int P, int me, Collective coll, PyObject* op, PyObject* algorithm, PyObject* root, PyObject* scale,
                   const uintptr_t* named, const BufferView& va, const BufferView& vb, CallKey* k,
                   PyObject* compress = Py_None) {
  if (compress != Py_None && coll != Collective::AllReduce && coll != Collective::AllGather &&
      coll != Collective::ReduceScatter)
    return false;  // (the Python path explains)
  static PyObject* const nccl_name = PyUnicode_InternFromString("nccl");
  static PyObject* const auto_name = PyUnicode_InternFromString("auto");
  const bool nccl = algorithm == nccl_name || (PyUnicode_CheckExact(algorithm) &&
                                               PyUnicode_Compare(algorithm, nccl_name) == 0);
  if (nccl && coll == Collective::Barrier) return false;
  if (!call_of(coll, P, me, op, nccl ? auto_name : algorithm, root, scale, va, vb, &k->call)) return false;
  if (nccl) k->call.algo = kNcclAlgorithmCode;
  // Both buffers on devices of one kind (the Python path explains mixtures).
  if (!on_device(va.kind) && va.kind != BufferKind::None) return false;
  if (!on_device(vb.kind) && vb.kind != BufferKind::None) return false;
  k->kind_a = va.kind;
  k->kind_b = vb.kind;
  k->device_a = va.device;
  k->device_b = vb.device;
  // The route's first buffer: the input side's, else (gather's, scatter's non-root) the output's.
  const BufferView& first = va.kind != BufferKind::None ? va : vb;
  k->own = first.own_stream;
  k->own_stream = first.own_stream ? first.stream : 0;
  k->current_stream = named != nullptr ? *named : first.stream;
  k->codec = compress == Py_None ? nullptr : compress;
  return true;
}

// The key of a C++ caller's call (core_api.h device_collective), as key_of would read its buffers.
inline CallKey native_key_of(const CollectiveCall& call, BufferKind kind_in, BufferKind kind_out, int device,
                             uintptr_t stream) {
  CallKey k;
  k.call = call;
  k.kind_a = kind_in;
  k.kind_b = kind_out;
  k.device_a = kind_in == BufferKind::None ? -1 : device;
  k.device_b = kind_out == BufferKind::None ? -1 : device;
  k.current_stream = stream;
  return k;
}

}  // namespace commlib
