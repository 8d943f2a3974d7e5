// Sends and receives, held back and issued together as batches: CPU tensors' as the core's batches,
// CUDA tensors' as the stream engine's (device_p2p.cc). commlib runs a communicator's calls
// in FIFO order, while torch issues isend/irecv one at a time: `irecv(p); isend(p)` on two ranks
// would deadlock if each ran when issued. So they wait here until something needs them: a wait,
// poll or future of one of their works, any other call of the group, or the end of a coalescing
// block (batch_isend_irecv).
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "bindings/core_api.h"
#include "torch_backend/device_calls.h"
#include "torch_backend/work.h"

namespace commlib {
namespace torch_backend {

// What a held message of a device tensor adds: where it goes and its work.
struct DeviceMessage {
  uint8_t kind;        // kCudaBuffer (kEmulatedBuffer: the test seam)
  int device;          // the device index
  uintptr_t stream_id;  // the caller's current stream when it called, as the device call cache keys it
  c10::Stream stream;  // the same as c10 names it
  at::Tensor user;     // a receive's own tensor when the message lands in a contiguous copy (copied back)
  c10::intrusive_ptr<CudaWork> work;
};

class P2PHold {
 public:
  struct Held {
    bool send;
    at::Tensor tensor;  // the bytes moved (contiguous)
    int peer;
    c10::intrusive_ptr<CommlibWork> work;  // a host message's
    std::shared_ptr<DeviceMessage> device;  // null for a host message
  };
  // Issues one batch of device messages (one device, at most one send to and one receive from each
  // peer): false with *err when it could not (the messages and every later batch of that device fail).
  using DeviceIssuer = std::function<bool(const std::vector<Held*>& round, CoreError* err)>;

  P2PHold(const CoreApi* api, void* core, Completer* completer, DeviceIssuer device_issuer)
      : api_(api), core_(core), completer_(completer), device_issuer_(std::move(device_issuer)) {}

  // Holds the send (or receive) of `t`'s bytes to (from) `peer`; `work` completes when it ran.
  void hold(bool send, at::Tensor t, int peer, c10::intrusive_ptr<CommlibWork> work);
  // The same for a device tensor (`t` contiguous, on `device`'s device).
  void hold_device(bool send, at::Tensor t, int peer, std::shared_ptr<DeviceMessage> device);
  // Issues everything held as batches: every host message in one batch of the core (the host's
  // batch_p2p takes several messages per peer and matches those between two ranks in call order);
  // the k-th message of each (kind, peer) on each device in that device's batch k (the stream
  // engine's batch takes at most one send to and one receive from each peer), so the batches, run
  // in order, keep the messages between two ranks in call order. Places go in the order of their
  // first message.
  void flush();
  bool pending() const { return pending_.load(std::memory_order_acquire); }
  // Flushes; a message held after this fails at once (the backend is shut down or going away).
  void close();
  // Runs `f` under the mutex a flush holds, as a flush does (the GIL let go while waiting for it):
  // the test seam of a flush that takes the GIL under the mutex (python_batch).
  void while_locked(const std::function<void()>& f);
  // Batches of host messages issued to the core so far (for tests).
  uint64_t host_batches() const { return host_batches_.load(std::memory_order_relaxed); }

 private:
  void flush_locked();
  bool issue_host(const std::vector<Held*>& round, CoreError* err);
  const CoreApi* api_;
  void* core_;
  Completer* completer_;
  DeviceIssuer device_issuer_;
  std::mutex mu_;
  std::vector<Held> held_;
  std::atomic<bool> pending_{false};
  bool closed_ = false;
  std::atomic<uint64_t> host_batches_{0};
};

}  // namespace torch_backend
}  // namespace commlib
