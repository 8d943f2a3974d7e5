// The Work of a call handed to the Python backend (commlib/torch/work.py's Work, or a completed
// one), held for C++ callers: it keeps the Python object alive and asks it, under the GIL, what
// torch asks a Work (Python Work subclasses answer only wait() and get_future() through torch's
// trampoline, so completion and the source rank are read from the Python object itself).
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/distributed/c10d/exception.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <utility>

#include "torch_backend/work.h"

namespace commlib {
namespace torch_backend {

class PythonWork : public c10d::Work {
 public:
  explicit PythonWork(pybind11::object work) : work_(std::move(work)) {}
  ~PythonWork() override {
    if (!Py_IsInitialized()) {
      work_.release();
      return;
    }
    pybind11::gil_scoped_acquire gil;
    work_ = pybind11::object();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    pybind11::gil_scoped_acquire gil;
    if (timeout == kNoTimeout) return work_.attr("wait")().cast<bool>();
    return work_.attr("wait")(timeout).cast<bool>();
  }
  bool isCompleted() override {
    pybind11::gil_scoped_acquire gil;
    return work_.attr("is_completed")().cast<bool>();
  }
  bool isSuccess() const override {
    pybind11::gil_scoped_acquire gil;
    return work_.attr("is_success")().cast<bool>();
  }
  std::exception_ptr exception() const override {
    pybind11::gil_scoped_acquire gil;
    pybind11::object exc = work_.attr("exception")();
    if (exc.is_none()) return nullptr;
    return dist_error(pybind11::str(exc).cast<std::string>());
  }
  int sourceRank() const override {
    pybind11::gil_scoped_acquire gil;
    return work_.attr("_source_rank")().cast<int>();
  }
  std::vector<at::Tensor> result() override {
    pybind11::gil_scoped_acquire gil;
    return work_.attr("result")().cast<std::vector<at::Tensor>>();
  }
  void synchronize() override {
    pybind11::gil_scoped_acquire gil;
    work_.attr("synchronize")();
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    pybind11::gil_scoped_acquire gil;
    return work_.attr("get_future")().cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>()->fut;
  }
  pybind11::object python_work() const { return work_; }

 private:
  pybind11::object work_;
};

}  // namespace torch_backend
}  // namespace commlib
