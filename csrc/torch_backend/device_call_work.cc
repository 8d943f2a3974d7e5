// CudaWork (torch_backend/device_calls.h): the Work of a call the C++ backend enqueued on a device
// stream (split out of device_calls.cc, which offers the calls).
#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "torch_backend/backend.h"
#include "torch_backend/device_calls.h"

namespace py = pybind11;

namespace commlib {
namespace torch_backend {

// -- CudaWork ------------------------------------------------------------------------------------
CudaWork::CudaWork(const CoreApi* api, c10d::OpType type, const char* collective, int rank,
                   std::vector<at::Tensor> outputs, std::shared_ptr<DeviceWork> work, c10::Stream issued)
    : c10d::Work(rank, type),
      api_(api),
      collective_(collective),
      rank_(rank),
      outputs_(std::move(outputs)),
      work_(std::move(work)),
      issued_(issued) {}

CudaWork::CudaWork(const CoreApi* api, c10d::OpType type, const char* collective, int rank,
                   std::vector<at::Tensor> outputs, c10::Stream caller, std::function<void()> flush)
    : c10d::Work(rank, type),
      api_(api),
      collective_(collective),
      rank_(rank),
      outputs_(std::move(outputs)),
      flush_(std::move(flush)),
      held_(true),
      issued_(caller) {}

void CudaWork::rearm(c10d::OpType type, const char* collective, const at::Tensor& output,
                     std::shared_ptr<DeviceWork> work, c10::Stream issued) {
  // (nothing else references this work: no lock is needed, and none taken)
  opType_ = type;
  collective_ = collective;
  outputs_.clear();  // (keeps its capacity)
  if (output.defined()) outputs_.push_back(output);
  work_ = std::move(work);
  issued_ = issued;
  future_.reset();
  failed_.reset();
  flush_ = nullptr;
  held_.store(false, std::memory_order_relaxed);
}

void CudaWork::issue(std::shared_ptr<DeviceWork> work, c10::Stream issued) {
  std::lock_guard<std::mutex> lock(mu_);
  work_ = std::move(work);
  issued_ = issued;
  held_.store(false, std::memory_order_release);
}

void CudaWork::fail(const CoreError& err) {
  std::lock_guard<std::mutex> lock(mu_);
  failed_ = std::make_unique<CoreError>(err);
  held_.store(false, std::memory_order_release);
}

bool CudaWork::issued(CoreError* err) {
  if (held_.load(std::memory_order_acquire) && flush_) flush_();  // (never under mu_: flush issues us)
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_) *err = *failed_;
  return !failed_;
}

void CudaWork::raise(const CoreError& err) const { raise_core_error(err, collective_, rank_); }

bool CudaWork::isCompleted() {
  CoreError err;
  if (!issued(&err)) return true;  // failed to go out: complete (wait() raises it)
  bool done = false;
  api_->device_is_completed(work_, &done, &err);  // a failed call is complete (wait() raises it)
  return done;
}

bool CudaWork::isSuccess() const {
  if (held_.load(std::memory_order_acquire) || failed_) return false;
  bool done = false;
  CoreError err;
  return api_->device_is_completed(work_, &done, &err) && done;
}

bool CudaWork::wait(std::chrono::milliseconds /*timeout: the stream waits, not the host*/) {
  bool done = false;
  CoreError err;
  if (!issued(&err)) raise(err);
  if (!api_->device_is_completed(work_, &done, &err)) raise(err);  // failed already: raise now
  if (done) return true;
  const c10::Stream now = current_stream(issued_.device());
  if (now != issued_) {  // another stream: it waits for an event recorded after the call
    c10::Event event(issued_.device_type());
    event.record(issued_);
    event.block(now);
  }
  return true;
}

void CudaWork::synchronize() {
  CoreError err;
  if (!issued(&err) || !api_->device_synchronize(work_, &err)) raise(err);
}

c10::intrusive_ptr<c10::ivalue::Future> CudaWork::getFuture() {
  CoreError err;
  const bool went_out = issued(&err);
  std::lock_guard<std::mutex> lock(mu_);
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{issued_.device()});
    if (!went_out) {  // a held message that could not go out: the future fails with its error
      future_->setError(future_error(err, collective_, rank_));
      return future_;
    }
    // Completed at once, on the issuing stream: the future records its events there (after the
    // call), and a waiter's stream waits for them, as ProcessGroupNCCL's future does.
    c10::StreamGuard on_issuing(issued_);
    future_->markCompleted(c10::IValue(outputs_));
  }
  return future_;
}

}  // namespace torch_backend
}  // namespace commlib
