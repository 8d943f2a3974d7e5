// The Work the commlib c10d::Backend returns for calls it runs on the core itself, and the thread
// that completes them. A work owns the core's queued call (or nothing, once a blocking call ran),
// the tensors torch reads back (result(), the future's value) and a real c10::ivalue::Future, which
// DDP's reducer chains on and torch.futures wraps: so the future must complete without anyone
// calling wait(), which is what the Completer's thread does, in call order.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bindings/core_api.h"

namespace commlib {
namespace torch_backend {

// Raises `err` as Python sees commlib's errors (commlib.MismatchError, PeerError, CommError,
// ValueError), with the collective and this rank named: takes the GIL, sets the Python error and
// throws pybind11::error_already_set, which torch's bindings hand back to the caller unchanged.
[[noreturn]] void raise_core_error(const CoreError& err, const char* collective, int rank);
// The same error as a C++ exception for futures (c10::DistBackendError, a RuntimeError in Python).
std::exception_ptr future_error(const CoreError& err, const char* collective, int rank);
// `message` as a c10::DistBackendError (what torch's own backends fail futures with).
std::exception_ptr dist_error(const std::string& message);
// Runs a call's `finish` (copies into the caller's outputs) below autograd, on whichever thread
// completes the call, as the backend's methods themselves run.
void run_finish(const std::function<void()>& finish);
// Keeps the core's table, whose error_class raise_core_error uses (once, when the module loads).
void init_error_classes(const CoreApi* api);

class CommlibWork : public c10d::Work {
 public:
  // `finish` runs once the core's call is done, before the future completes (copies back out of
  // staging buffers); `core` null: the call already ran (a completed work). `flush` given: a
  // held-back send or receive (p2p.h), which completes once issue() or fail() is called; waiting
  // on it, polling it or asking for its future calls `flush` first, which issues it.
  CommlibWork(const CoreApi* api, c10d::OpType type, const char* collective, int rank,
              std::vector<at::Tensor> outputs, std::shared_ptr<commlib::Work> core, std::function<void()> finish,
              std::function<void()> flush = nullptr);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Waits for the call (timeout: torch's, kNoTimeout = forever) and raises its error as
  // commlib's Python error; a timeout raises c10::DistBackendError naming the collective.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // A receive from any source: the sender's rank, once the call is done (waits for it).
  int sourceRank() const override;

  // The completion thread's half: waits for the core's call and completes the future.
  void complete();
  // A held-back work's call, issued (then handed to the completion thread), or its failure to be.
  void issue(std::shared_ptr<commlib::Work> core);
  void fail(const CoreError& err);
  // recvAnysource: where the core writes the sender's rank.
  void set_source(std::shared_ptr<int32_t> source) { source_ = std::move(source); }
  // Makes this work a blocking call's, done and succeeded, of `type`: its outputs held weakly
  // (result() and the future give those the caller still holds), so that a finished work kept for
  // reuse (CommlibBackend::done_work) keeps no tensor alive, and the last reference to a tensor is
  // never dropped here, where torch would take the GIL to release its Python object. Only for a
  // work nobody else holds (a new one, or a spare one whose other references are gone).
  void rearm_done(c10d::OpType type, const char* collective, const std::vector<at::Tensor>& outputs);

 private:
  const CoreApi* api_;
  const char* collective_;
  int rank_;
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<commlib::Work> core_;  // (plain `Work` here names c10d::Work, the base)
  std::function<void()> finish_;
  std::function<void()> flush_;
  std::shared_ptr<int32_t> source_;
  // A blocking call's outputs (rearm_done), in place of outputs_.
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> weak_outputs_;
  bool weak_ = false;
  // The outputs: outputs_, or those of weak_outputs_ still alive.
  std::vector<at::Tensor> outputs() const;
  // Completes `future` with the outputs or the call's error (the call is done).
  void complete_future(const c10::intrusive_ptr<c10::ivalue::Future>& future);
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // made when first asked (getFuture), under mu_
  mutable std::mutex mu_;
  bool failed_ = false;
  CoreError error_;
  mutable std::condition_variable done_cv_;
  // Set under mu_ after failed_ and error_ (which never change after it), so a thread that reads it
  // true without the lock (wait(), isCompleted(): a blocking call's work, done when made) may read
  // failed_ too.
  std::atomic<bool> done_{false};
  void settle(bool ok, const CoreError& err);  // records the outcome and completes the future
};

// The one Work torch's coalescing manager gets from endCoalescing (batch_isend_irecv, collectives
// issued between _start_coalescing and _end_coalescing): done when every call of the block is;
// its future's value is their outputs, in call order, or the first error.
class CoalescedWork : public c10d::Work {
 public:
  CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// One thread per backend, started at the first asynchronous call: completes works in call order.
class Completer {
 public:
  ~Completer() { stop(); }
  void put(c10::intrusive_ptr<CommlibWork> work);
  // True on the completion thread itself: a future's callback that issues a collective there
  // (PowerSGD's hook) must run it blocking, or it would wait on its own thread.
  bool on_thread() const { return std::this_thread::get_id() == thread_id_; }
  void stop();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<CommlibWork>> queue_;
  bool stopping_ = false;
  std::thread thread_;
  std::thread::id thread_id_;
};

}  // namespace torch_backend
}  // namespace commlib
