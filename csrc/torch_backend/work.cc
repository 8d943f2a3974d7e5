// CommlibWork and Completer (torch_backend/work.h), and commlib's errors as torch callers see them.
#include "torch_backend/work.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/csrc/distributed/c10d/exception.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <utility>

namespace py = pybind11;

namespace commlib {
namespace torch_backend {
namespace {

// The core's table, whose error_class maps an error's kind to its Python class (the bindings' one
// table, bindings/error_kinds.h): no mapping of the backend's own.
const CoreApi* g_api = nullptr;

std::string describe(const CoreError& err, const char* collective, int rank) {
  // The core's messages name the rank and the call already when they come from a call; say which
  // torch collective it was in any case (a message from an aborted communicator names neither).
  return "commlib " + std::string(collective) + " on rank " + std::to_string(rank) + ": " + err.message;
}

}  // namespace

void init_error_classes(const CoreApi* api) { g_api = api; }

void run_finish(const std::function<void()>& finish) {
  // Below autograd, as the backend's own methods run (torch's fallback for c10d ops redispatches
  // under this guard): on the completion thread grad mode is on, and a copy into an output that
  // autograd has since wrapped (a functional collective's result) would be recorded as an
  // in-place op, replacing the output's history by one whose gradient is zero.
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  finish();
}

void raise_core_error(const CoreError& err, const char* collective, int rank) {
  py::gil_scoped_acquire gil;
  PyObject* cls = g_api ? g_api->error_class(err.kind) : PyExc_RuntimeError;
  PyErr_SetString(cls, describe(err, collective, rank).c_str());
  throw py::error_already_set();
}

std::exception_ptr dist_error(const std::string& message) {
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    return std::current_exception();
  }
}

std::exception_ptr future_error(const CoreError& err, const char* collective, int rank) {
  return dist_error(describe(err, collective, rank));
}

CommlibWork::CommlibWork(const CoreApi* api, c10d::OpType type, const char* collective, int rank,
                         std::vector<at::Tensor> outputs, std::shared_ptr<commlib::Work> core, std::function<void()> finish,
                         std::function<void()> flush)
    : c10d::Work(rank, type),
      api_(api),
      collective_(collective),
      rank_(rank),
      outputs_(std::move(outputs)),
      core_(std::move(core)),
      finish_(std::move(finish)),
      flush_(std::move(flush)) {
  // Ran already (a blocking call): done now, without the core's wait or the lock (no other thread
  // sees this work yet, no future is made); with a `finish` still to run, through complete().
  if (!core_ && !flush_) {
    if (finish_)
      complete();
    else
      done_.store(true, std::memory_order_release);
  }
}

void CommlibWork::issue(std::shared_ptr<commlib::Work> core) {
  std::lock_guard<std::mutex> lk(mu_);
  core_ = std::move(core);
}

void CommlibWork::fail(const CoreError& err) {
  finish_ = nullptr;
  settle(false, err);
}

c10::intrusive_ptr<c10::ivalue::Future> CommlibWork::getFuture() {
  if (flush_) flush_();  // a held-back message: its future completes only once it is issued
  // Made when first asked (a blocking call's work is never asked: no future, no list of outputs
  // built for it); completed here when the call is done already, else by settle().
  static const c10::TypePtr kTensors = c10::ListType::create(c10::TensorType::get());
  c10::intrusive_ptr<c10::ivalue::Future> future;
  bool done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (future_) return future_;
    future_ = future = c10::make_intrusive<c10::ivalue::Future>(kTensors);
    done = done_;
  }
  if (done) complete_future(future);  // (outside the lock: callbacks run here)
  return future;
}

void CommlibWork::complete_future(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
  bool failed;
  CoreError err;
  {
    std::lock_guard<std::mutex> lk(mu_);
    failed = failed_;
    err = error_;
  }
  if (!failed)
    future->markCompleted(c10::IValue(outputs()));
  else
    future->setError(future_error(err, collective_, rank_));
}

int CommlibWork::sourceRank() const {
  if (!source_) return c10d::Work::sourceRank();  // torch's own error for other calls
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return done_.load(); });
  return *source_;
}

void CommlibWork::complete() {
  CoreError err;
  bool done = false;
  bool ok = api_->wait(core_, -1.0, &done, &err);
  if (ok && finish_) {
    try {
      run_finish(finish_);
    } catch (const std::exception& e) {
      ok = false;
      err = {kCoreOtherError, e.what()};
    }
  }
  finish_ = nullptr;
  settle(ok, err);
}

void CommlibWork::settle(bool ok, const CoreError& err) {
  c10::intrusive_ptr<c10::ivalue::Future> future;  // asked for before the call was done
  {
    std::lock_guard<std::mutex> lk(mu_);
    core_.reset();
    failed_ = !ok;
    error_ = err;
    done_.store(true, std::memory_order_release);
    future = future_;
  }
  done_cv_.notify_all();
  // Callbacks chained on the future run here (on the completion thread for queued calls).
  if (future) complete_future(future);
}

bool CommlibWork::isCompleted() {
  if (flush_) flush_();
  return done_.load(std::memory_order_acquire);
}

bool CommlibWork::isSuccess() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_ && !failed_;
}

std::exception_ptr CommlibWork::exception() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failed_ ? future_error(error_, collective_, rank_) : nullptr;
}

std::vector<at::Tensor> CommlibWork::outputs() const {
  if (!weak_) return outputs_;
  std::vector<at::Tensor> alive;
  for (const auto& w : weak_outputs_)
    if (auto t = w.lock(); t.defined()) alive.emplace_back(std::move(t));
  return alive;
}

std::vector<at::Tensor> CommlibWork::result() { return outputs(); }

void CommlibWork::rearm_done(c10d::OpType type, const char* collective, const std::vector<at::Tensor>& outputs) {
  opType_ = type;
  collective_ = collective;
  outputs_.clear();
  weak_outputs_.clear();  // (keeps its capacity: a reused work allocates nothing)
  for (const auto& t : outputs) weak_outputs_.emplace_back(t.getIntrusivePtr());
  weak_ = true;
  future_.reset();
  failed_ = false;
  done_.store(true, std::memory_order_release);
}

bool CommlibWork::wait(std::chrono::milliseconds timeout) {
  if (flush_) flush_();
  // A blocking call's work (torch waits on it after every blocking call) is done and succeeded.
  if (done_.load(std::memory_order_acquire) && !failed_) return true;
  std::unique_lock<std::mutex> lk(mu_);
  auto ready = [&] { return done_.load(std::memory_order_relaxed); };
  if (timeout == kNoTimeout || timeout.count() <= 0) {
    done_cv_.wait(lk, ready);
  } else if (!done_cv_.wait_for(lk, timeout, ready)) {
    C10_THROW_ERROR(DistBackendError, "commlib " + std::string(collective_) + " on rank " +
                                          std::to_string(rank_) + ": work.wait timed out after " +
                                          std::to_string(timeout.count()) + " ms");
  }
  if (failed_) {
    CoreError err = error_;
    lk.unlock();
    raise_core_error(err, collective_, rank_);
  }
  return true;
}

namespace {

// The block's future: CUDA-aware over the devices of its calls' futures (CUDA works'), so that
// waiting on it orders the waiter's stream after the block, as each call's own future does.
c10::intrusive_ptr<c10::ivalue::Future> block_future(
    const std::vector<c10::intrusive_ptr<c10::ivalue::Future>>& futures) {
  std::vector<c10::Device> devices;
  for (const auto& f : futures)
    for (const auto& d : f->devices())
      if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
}

}  // namespace

CoalescedWork::CoalescedWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(rank, c10d::OpType::COALESCED), works_(std::move(works)) {
  // The block's future completes on the thread that completes its last call.
  struct State {
    std::mutex mu;
    size_t left;
    std::exception_ptr error;
    std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
  };
  auto state = std::make_shared<State>();
  state->left = works_.size();
  for (auto& w : works_) state->futures.push_back(w->getFuture());
  future_ = block_future(state->futures);
  if (works_.empty()) {
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>()));
    return;
  }
  auto fut = future_;
  for (auto& f : state->futures) {
    f->addCallback([state, fut](c10::ivalue::Future& done) {
      bool last;
      {
        std::lock_guard<std::mutex> lk(state->mu);
        if (done.hasError() && !state->error) state->error = done.exception_ptr();
        last = --state->left == 0;
      }
      if (!last) return;
      if (state->error) return fut->setError(state->error);
      std::vector<at::Tensor> outputs;
      for (auto& g : state->futures) {  // (a handed-over call's value may be a Python object: skipped)
        const c10::IValue& v = g->value();
        if (v.isTensorList())
          for (const auto& t : v.toTensorVector()) outputs.push_back(t);
        else if (v.isList())
          for (const auto& e : v.toListRef())
            if (e.isTensor()) outputs.push_back(e.toTensor());
      }
      fut->markCompleted(c10::IValue(outputs));
    });
  }
}

bool CoalescedWork::isCompleted() {
  for (auto& w : works_)
    if (!w->isCompleted()) return false;
  return true;
}

bool CoalescedWork::isSuccess() const {
  for (auto& w : works_)
    if (!w->isSuccess()) return false;
  return true;
}

std::exception_ptr CoalescedWork::exception() const {
  for (auto& w : works_)
    if (auto e = w->exception()) return e;
  return nullptr;
}

std::vector<at::Tensor> CoalescedWork::result() {
  std::vector<at::Tensor> outputs;
  for (auto& w : works_)
    for (auto& t : w->result()) outputs.push_back(t);
  return outputs;
}

bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  // Every call in block order: each raises its own error, the first one first.
  for (auto& w : works_) w->wait(timeout);
  return true;
}

void Completer::put(c10::intrusive_ptr<CommlibWork> work) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!thread_.joinable()) {
    thread_ = std::thread([this] { loop(); });
    thread_id_ = thread_.get_id();
  }
  queue_.push_back(std::move(work));
  cv_.notify_one();
}

void Completer::loop() {
  for (;;) {
    c10::intrusive_ptr<CommlibWork> work;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every work completed
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work->complete();
  }
}

void Completer::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && !on_thread()) thread_.join();
  if (thread_.joinable()) thread_.detach();
}

}  // namespace torch_backend
}  // namespace commlib
