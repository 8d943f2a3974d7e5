// The one C++ entry from Python (bindings/fast_call.cc) and the device call cache behind it
// (bindings/device_call_cache.h): what they share.
#pragma once

#include <Python.h>

#include <exception>
#include <memory>
#include <utility>
#include <vector>

#include "bindings/buffer_view.h"
#include "bindings/gil.h"
#include "plan/call.h"

namespace commlib {

// The collective call the arguments of one method call describe (`a`: the input-side buffer,
// all_reduce/broadcast/reduce's tensor; `b`: the output side or None; as Communicator's methods
// pass them), exactly as the host path would run it: false, no Python error set, for anything
// that is not a plain, consistent call (the Python path then decides and explains). `P`, `me`:
// the communicator's size and this rank. The op and scale of non-reducing collectives are ignored.
bool call_of(Collective coll, int P, int me, PyObject* op, PyObject* algorithm, PyObject* root, PyObject* scale,
             const BufferView& va, const BufferView& vb, CollectiveCall* call);

void set_python_error(std::exception_ptr p);  // (bindings.h)

// Runs `run` (a call into the core that may block) with the GIL released, as every fast entry
// does: true, or false with the Python error its exception maps to (set_python_error) set, once
// the GIL is held again. What `run` makes it hands out through its captures.
template <class Run>
bool ran_released(Run&& run) {
  std::exception_ptr error;
  {
    ReleaseGil nogil;
    try {
      std::forward<Run>(run)();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (!error) return true;
  set_python_error(error);
  return false;
}

// ran_released for a call whose answer is None: None, or nullptr with the Python error set.
template <class Run>
PyObject* run_released(Run&& run) {
  if (!ran_released(std::forward<Run>(run))) return nullptr;
  Py_RETURN_NONE;
}

class DeviceCallCache;

// A device call through the entry: None (blocking) or the work handle (async_op=True) when the
// cache held it and it was enqueued, NotImplemented for the Python path, nullptr (error set) when
// the engine raised. `compress`: the call's compress= argument (None: none).
PyObject* run_device_call(DeviceCallCache& cache, Collective coll, PyObject* const* args, const BufferView& va,
                          const BufferView& vb, PyObject* compress);

// The point-to-point batch of an all_to_all with split sizes from `in` to `out` (device_all_to_allv.cc,
// as core/p2p_plan.py plan_all_to_allv builds it): `*items` (a send and a receive per peer, in its
// order) and this rank's block to itself (`*own`); `*splits` the P input then P output sizes. False
// (no Python error set) for anything the Python path refuses or reads further (split_sizes'
// checks, a split that is not an int of a list or tuple, overlapping buffers, an own block whose
// sizes differ); dtypes and devices are the caller's to check.
struct AllToAllvOwnBlock {
  uintptr_t dst = 0, src = 0;
  size_t bytes = 0;
};
bool plan_all_to_allv(int P, int me, const BufferView& in, const BufferView& out, PyObject* output_splits,
                      PyObject* input_splits, std::vector<int64_t>* splits, std::vector<P2PItem>* items,
                      AllToAllvOwnBlock* own);

// all_to_all with split sizes (`output_splits`, `input_splits`: the caller's, None for equal
// blocks) through the entry: DeviceCallCache::run_all_to_allv, the same answers.
PyObject* run_device_all_to_allv(DeviceCallCache& cache, PyObject* const* args, const BufferView& va,
                                 const BufferView& vb, PyObject* output_splits, PyObject* input_splits);

class Communicator;
// A host collective with compress= through the entry (bindings/host_compressed_calls.cc), blocking or
// async: true with `*call` (call_of's reading of the buffers, op and scale, with the codec and the
// algorithm resolved) when the Python path resolved this call's codec before; false (no Python error
// set) for the Python path.
bool host_compressed_call(Communicator& comm, Collective coll, PyObject* const* args, const BufferView& va,
                          const BufferView& vb, PyObject* compress, CollectiveCall* call);

class DeviceWork;
// The same entry for a C++ caller without the GIL (core_api.h's device_collective: the torch
// backend's CUDA tensors): `call` as call_of would read it from the buffers, their kinds (kind_out
// None where the method took one buffer), device and the current stream's identity. Enqueues it
// with a work handle when the cache holds it (true); false: not cached, nothing ran. Throws what
// the engine throws.
bool run_device_call_native(DeviceCallCache& cache, const CollectiveCall& call, BufferKind kind_in,
                            BufferKind kind_out, int device, uintptr_t stream, std::shared_ptr<DeviceWork>* work);
// Point-to-point from a C++ caller without the GIL (core_api.h's device_p2p): `items` (at most one
// send to and one receive from each peer) of buffers of `kind` on `device`, enqueued on the stream
// whose identity is `stream` when the route has enqueued a call there as a current stream (true);
// false: it has not (nothing ran). Throws what the engine throws. `a2av_count` >= 0: the batch is an
// all_to_all with split sizes, numbered as a collective (StreamEngine::all_to_allv; core_api.h
// device_all_to_allv), `a2av_count` the elements this rank sends.
bool run_device_p2p_native(DeviceCallCache& cache, const P2PItem* items, size_t n, DType dtype, BufferKind kind,
                           int device, uintptr_t stream, std::shared_ptr<DeviceWork>* work, int64_t a2av_count = -1);

}  // namespace commlib
