// The Work the commlib c10d::Backend returns for calls it runs on the core itself, and the thread
// that completes them. A work owns the core's queued call (or nothing, once a blocking call ran),
// the tensors torch reads back (result(), the future's value) and a real c10::ivalue::Future, which
// DDP's reducer chains on and torch.futures wraps: so the future must complete without anyone
// calling wait(), which is what the Completer's thread does, in call order.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

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
// Looks up commlib's Python error classes (needs the GIL; once, when the module loads).
void init_error_classes();

class CommlibWork : public c10d::Work {
 public:
  // `finish` runs once the core's call is done, before the future completes (copies back out of
  // staging buffers); `core` null: the call already ran (a completed work).
  CommlibWork(const CoreApi* api, c10d::OpType type, const char* collective, int rank,
              std::vector<at::Tensor> outputs, std::shared_ptr<commlib::Work> core, std::function<void()> finish);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Waits for the call (timeout: torch's, kNoTimeout = forever) and raises its error as
  // commlib's Python error; a timeout raises c10::DistBackendError naming the collective.
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // The completion thread's half: waits for the core's call and completes the future.
  void complete();

 private:
  const CoreApi* api_;
  const char* collective_;
  int rank_;
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<commlib::Work> core_;  // (plain `Work` here names c10d::Work, the base)
  std::function<void()> finish_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  mutable std::mutex mu_;
  bool failed_ = false;
  CoreError error_;
  std::condition_variable done_cv_;
  bool done_ = false;
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
