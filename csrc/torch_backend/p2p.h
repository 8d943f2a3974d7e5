// Sends and receives of CPU tensors, held back and issued together as the core's batches (the C++
// half of what commlib/torch/p2p.py does for device tensors). commlib runs a communicator's calls
// in FIFO order, while torch issues isend/irecv one at a time: `irecv(p); isend(p)` on two ranks
// would deadlock if each ran when issued. So they wait here until something needs them: a wait,
// poll or future of one of their works, any other call of the group, or the end of a coalescing
// block (batch_isend_irecv).
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "bindings/core_api.h"
#include "torch_backend/work.h"

namespace commlib {
namespace torch_backend {

class P2PHold {
 public:
  P2PHold(const CoreApi* api, void* core, Completer* completer) : api_(api), core_(core), completer_(completer) {}

  // Holds the send (or receive) of `t`'s bytes to (from) `peer`; `work` completes when it ran.
  void hold(bool send, at::Tensor t, int peer, c10::intrusive_ptr<CommlibWork> work);
  // Issues everything held as batches: the k-th message of each (kind, peer) goes into batch k (a
  // core batch takes at most one send to and one receive from each peer), so the batches, run in
  // order, keep the messages between two ranks in call order.
  void flush();
  bool pending() const { return pending_.load(std::memory_order_acquire); }
  // Flushes; a message held after this fails at once (the backend is shut down or going away).
  void close();

 private:
  struct Held {
    bool send;
    at::Tensor tensor;
    int peer;
    c10::intrusive_ptr<CommlibWork> work;
  };
  void flush_locked();
  const CoreApi* api_;
  void* core_;
  Completer* completer_;
  std::mutex mu_;
  std::vector<Held> held_;
  std::atomic<bool> pending_{false};
  bool closed_ = false;
};

}  // namespace torch_backend
}  // namespace commlib
