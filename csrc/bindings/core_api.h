// The core's C++ entry for other extension modules of this process (today commlib._C_torch, the
// torch c10d::Backend in csrc/torch_backend): a table of plain function pointers, handed out by
// `_C.core_api()` as a PyCapsule. Why a table and not linking the core twice: the core keeps
// process-wide state (the algorithm registry with the names Python registered, the settings, the
// fork guards), so a second copy in another module would disagree with the first; and the core is
// built with hidden visibility, so no symbol of it is reachable from outside _C. Everything here is
// called without the GIL and never throws: errors come back as an ErrorKind and a message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/errors.h"
#include "common/types.h"
#include "plan/call.h"

typedef struct _object PyObject;  // Python.h's own declaration: this header needs no Python

namespace commlib {

class Work;        // host/communicator.h: a queued call (opaque here)
class DeviceWork;  // stream/device_work.h: a call enqueued on a device stream (opaque here)

// Bumped whenever the table's layout or meaning changes; a module built against another layout
// refuses to load (the capsule's name carries it too).
// v2: receive from any source; a per-call timeout on every call.
constexpr uint32_t kCoreApiVersion = 2;
constexpr const char* kCoreApiCapsule = "commlib._C.core_api.v2";

// Error kinds beyond the core's (common/errors.h ErrorKind): bad arguments, memory, anything else,
// and the store's (bootstrap/store_error.h StoreError: commlib.errors' RendezvousError and its
// StoreLostError, met by a device engine's set-up from C++), so that a caller in another module
// raises the class the Python path raises, not RuntimeError. New kinds only ever extend the list:
// a module that does not know one raises it as RuntimeError (error_class's fallback).
constexpr uint32_t kCoreInvalidArgument = 100;
constexpr uint32_t kCoreOtherError = 101;
constexpr uint32_t kCoreNoMemory = 102;
constexpr uint32_t kCoreRendezvousError = 103;
constexpr uint32_t kCoreStoreLostError = 104;

// What a C++ caller holds to learn that a device call retired without holding the call's work
// (device_ticket): the engine (opaque here) and the engine's number of the call; seq 0: nothing to
// wait for (a null work, a call captured in a graph). Copying it allocates nothing.
struct DeviceTicket {
  std::shared_ptr<void> engine;
  uint64_t seq = 0;
};

struct CoreError {
  uint32_t kind = 0;  // ErrorKind (None/Comm/Mismatch/Peer) or kCoreInvalidArgument/...; for the
                      // store's kinds the message without its class (StoreError::message)
  std::string message;
};

struct CoreApi {
  uint32_t version;
  // A collective on the communicator at `comm` (the address _C.core_address gives): blocking
  // (async false: *work stays null) or queued (*work: the call's work). False on error.
  // `timeout_s` > 0: the call's own timeout in place of the communicator's (a silent peer is a
  // PeerError naming it and the call after that long); 0: the communicator's.
  bool (*collective)(void* comm, const CollectiveCall& call, bool async, double timeout_s,
                     std::shared_ptr<Work>* work, CoreError* err);
  // Concurrent sends and receives (one batch: any number to and from each peer, a pair's matched in
  // call order).
  bool (*p2p)(void* comm, const P2PItem* items, size_t n, DType dtype, bool async, double timeout_s,
              std::shared_ptr<Work>* work, CoreError* err);
  // Receives `count` elements from whichever peer sends first, writing its rank to *source.
  bool (*recv_any)(void* comm, uintptr_t ptr, int64_t count, DType dtype, int32_t* source, bool async,
                   double timeout_s, std::shared_ptr<Work>* work, CoreError* err);
  // Waits up to timeout_s (negative: forever); *done false on timeout. False when the call failed.
  bool (*wait)(const std::shared_ptr<Work>& work, double timeout_s, bool* done, CoreError* err);
  bool (*is_completed)(const std::shared_ptr<Work>& work);
  // 0 for "auto", else the registry's index (CollectiveCall::algo); -1 when unknown.
  int (*algorithm_index)(Collective c, const char* name);
  int (*rank)(void* comm);
  int (*size)(void* comm);
  // Fails queued and later calls at once (peers are told), as Communicator::abort.
  void (*abort)(void* comm, const char* reason);
  // The Python class an error's kind is raised as (borrowed; commlib._C's classes, commlib.errors'
  // RendezvousError and StoreLostError, ValueError, MemoryError, RuntimeError; call it with the GIL): the bindings' one table (bindings/error_kinds.h), so a module
  // raising the core's errors needs no mapping of its own. Last, so a module that does not read
  // it yet sees the same layout.
  PyObject* (*error_class)(uint32_t kind);

  // -- device calls (issue #44: the torch backend's CUDA tensors), appended: the layout above is
  // unchanged. `cache`: a communicator's device call cache (DeviceRoute.fast_calls_address,
  // bindings/device_call_cache.h), filled by the Python path after a call passed its checks.
  // A collective on device buffers: `call` as the Python path's arguments describe it (addresses,
  // count, dtype, op, root, the requested algorithm), `kind_in`/`kind_out` the buffers' kinds
  // (bindings/buffer_view.h BufferKind: 2 emulated, 3 CUDA; 0 for an output the method does not
  // take), `device` their device index, `stream` the current stream (the cudaStream_t; the
  // emulated stream's identity). 1: enqueued on that stream, *work its handle (a call the cache
  // holds, or a new shape on a stream of an engine the route set up, checked and resolved in C++:
  // device_call_new_shape.cc); 0: nothing ran (the route has set no engine up on that device yet,
  // or an argument the Python path explains, or algorithm="nccl" before NCCL's communicator exists:
  // the caller hands the call to the Python path, which sets up, checks and raises or runs it);
  // -1: error (err).
  int (*device_collective)(void* cache, const CollectiveCall& call, uint8_t kind_in, uint8_t kind_out, int device,
                           uintptr_t stream, std::shared_ptr<DeviceWork>* work, CoreError* err);
  // The engine retired the call (seen complete; an atomic load, no device call): its buffers may go.
  bool (*device_known_complete)(const std::shared_ptr<DeviceWork>& work);
  // Polls the device (the done word or the event). False with err when the call failed.
  bool (*device_is_completed)(const std::shared_ptr<DeviceWork>& work, bool* done, CoreError* err);
  // Blocks the host until the call ran; false with err when it failed.
  bool (*device_synchronize)(const std::shared_ptr<DeviceWork>& work, CoreError* err);

  // -- device point-to-point (the torch backend's CUDA sends and receives), appended likewise.
  // One batch (at most one send to and one receive from each peer) of `items` on buffers of `kind`
  // on `device`, enqueued on the stream whose identity is `stream` (as device_collective's) by the
  // engine the route set up for that device, once the route has enqueued a call on that stream as a
  // current stream. 1: enqueued, *work its handle; 0: it has not (nothing ran: the caller runs the
  // batch through Communicator.batch_p2p, which sets the engine up, checks and remembers the
  // stream); -1: error (err).
  int (*device_p2p)(void* cache, const P2PItem* items, size_t n, DType dtype, uint8_t kind, int device,
                    uintptr_t stream, std::shared_ptr<DeviceWork>* work, CoreError* err);
  // The engine's work behind a device work of the Python path (commlib.core.device_route.DeviceWork,
  // what Communicator.batch_p2p(async_op=True) returns for device buffers). Under the GIL. False
  // (nothing set) when `obj` is not one.
  bool (*device_work_of)(PyObject* obj, std::shared_ptr<DeviceWork>* work);

  // -- retire tickets (issue #37: pooled works), appended likewise. A caller that holds buffers
  // until a call retired holds the call's ticket, not its work: device_collective re-arms a work
  // for a later call once no one but the cache owns it (bindings/device_work_pool.h,
  // NativeWorkPool), so a work held only to poll would both keep it from the pool and, re-armed,
  // answer for another call. The ticket of `work`, and whether its call retired (an atomic load,
  // no device call, as device_known_complete).
  void (*device_ticket)(const std::shared_ptr<DeviceWork>& work, DeviceTicket* ticket);
  bool (*device_ticket_retired)(const DeviceTicket& ticket);

  // -- all_to_all with split sizes numbered as a collective (issue #44, session 28), appended
  // likewise: the point-to-point batch `items` (a send to and a receive from each peer, in
  // core/p2p_plan.py's order; this rank's own block is the caller's to copy) run as p2p runs it but
  // taking the communicator's next call number, as commlib's own routes take it
  // (Communicator::all_to_allv, StreamEngine::all_to_allv), so the call numbers agree whichever
  // route a rank's call took and a failure names "all_to_all #n" and the rank, not a message of
  // the batch. `count`: the elements (of `dtype`) this rank sends, as the call's descriptor reads.
  // On the host (as p2p, `timeout_s` likewise):
  bool (*all_to_allv)(void* comm, const P2PItem* items, size_t n, DType dtype, int64_t count, bool async,
                      double timeout_s, std::shared_ptr<Work>* work, CoreError* err);
  // On device buffers (as device_p2p: 1 enqueued, 0 no engine on that stream's device yet, -1 err):
  int (*device_all_to_allv)(void* cache, const P2PItem* items, size_t n, DType dtype, int64_t count, uint8_t kind,
                            int device, uintptr_t stream, std::shared_ptr<DeviceWork>* work, CoreError* err);
};

}  // namespace commlib
