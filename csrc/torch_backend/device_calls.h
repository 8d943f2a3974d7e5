// CUDA tensors on the C++ backend (issue #44): a collective on CUDA tensors is enqueued on the
// caller's current stream by the stream engine, as torch's NCCL backend orders its calls, with no
// Python on a steady call's path: the backend builds the call as the Python path would describe
// it and offers it to the communicator's device call cache (bindings/device_call_cache.h) through
// the core's table (core_api.h device_collective). The first call on a group and device is handed
// to the Python backend (its device route sets the engine up); later calls run from here, on any
// stream (wrapped in C++ at its first call: bindings/device_p2p_streams.h), of any shape: a call the cache holds, or a new shape the core checks as the Python path
// would and resolves itself (bindings/device_call_new_shape.cc). What those checks would refuse is
// declined and handed over too, so the Python side raises its message naming the argument.
//
// Built without CUDA headers or libc10_cuda (one _C_torch for torch's CPU and CUDA builds): the
// current stream, events and the future's device handling go through c10's device-generic
// interfaces (c10::impl::VirtualGuardImpl, c10::Stream::native_handle, c10::Event), which a CUDA
// build of torch backs with its CUDA implementation.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "bindings/core_api.h"
#include "common/ring_queue.h"

namespace commlib {
namespace torch_backend {

// The buffer kinds of core_api.h's device_collective (bindings/buffer_view.h BufferKind).
constexpr uint8_t kNoBuffer = 0, kEmulatedBuffer = 2, kCudaBuffer = 3;

// A CUDA tensor the cache can have seen as it is: dense, contiguous, neither conjugate nor a
// negative view (the Python path stages anything else, so its buffers differ every call).
bool device_layout(const at::Tensor& t);
// The current stream of `device` as c10 knows it (torch's current CUDA stream on a CUDA build).
c10::Stream current_stream(c10::Device device);

// The work of a call enqueued on a CUDA stream (what ProcessGroupNCCL's work does): `wait()` makes
// the waiting thread's current stream wait for the call (nothing when it is the issuing stream;
// otherwise one event recorded on the issuing stream and waited on, recorded only when asked) and
// raises the call's error if it already failed; `synchronize()` blocks the host until it ran;
// `isCompleted()` polls the device; `getFuture()` a CUDA-aware c10::ivalue::Future (devices: the
// call's) completed with the outputs, whose waiters' streams wait for the issuing stream.
class CudaWork : public c10d::Work {
 public:
  CudaWork(const CoreApi* api, c10d::OpType type, const char* collective, int rank, std::vector<at::Tensor> outputs,
           std::shared_ptr<DeviceWork> work, c10::Stream issued);
  // A send or receive held back (P2PHold): `flush` issues it (and calls issue() or fail()); every
  // method runs it first when the message is still held.
  CudaWork(const CoreApi* api, c10d::OpType type, const char* collective, int rank, std::vector<at::Tensor> outputs,
           c10::Stream caller, std::function<void()> flush);
  // The held message went out as `work` (null: nothing to move) on `issued`, or failed with `err`.
  void issue(std::shared_ptr<DeviceWork> work, c10::Stream issued);
  void fail(const CoreError& err);
  // A pooled work made ready for another call (DeviceCalls::work_for: only one nothing else
  // references): what the first constructor sets, the future, error and hold forgotten.
  void rearm(c10d::OpType type, const char* collective, const at::Tensor& output, std::shared_ptr<DeviceWork> work,
             c10::Stream issued);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  [[noreturn]] void raise(const CoreError& err) const;
  // Issues a held message (its flush); then false with *err when it failed to go out.
  bool issued(CoreError* err);
  const CoreApi* api_;
  const char* collective_;
  int rank_;
  std::vector<at::Tensor> outputs_;
  std::function<void()> flush_;
  std::atomic<bool> held_{false};
  std::mutex mu_;                  // work_, issued_, failed_ once held_ went false; the future
  std::shared_ptr<DeviceWork> work_;
  c10::Stream issued_;
  std::unique_ptr<CoreError> failed_;  // a held message that could not go out
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // made when first asked
};

// One backend's way to the communicator's device call cache, the tensors of its calls, held
// until the engine retired each call (as the Python path holds its buffers), and its calls' works,
// pooled: a steady call allocates nothing here (#37: a pooled CudaWork re-armed, the held tensors
// in the slots of a ring that grows only past its largest size).
class DeviceCalls {
 public:
  // CudaWorks kept at most: a caller holding more at once gets new ones (as before pooling).
  static constexpr size_t kMaxWorks = 64;
  explicit DeviceCalls(const CoreApi* api) : api_(api) {}
  // The work of a call run from C++: a pooled one that nothing but the pool references any more (no
  // torch Work handle, Python object, future chain or weak reference: c10::intrusive_ptr's strong and
  // weak counts, read under the pool's mutex, cannot rise behind the check, since a new reference can
  // only be made from an existing one and the pool's is the only one), re-armed; else a new one,
  // pooled while there is room.
  c10::intrusive_ptr<CudaWork> work_for(const CoreApi* api, c10d::OpType type, const char* name, int rank,
                                        const at::Tensor& output, std::shared_ptr<DeviceWork> work, c10::Stream issued);
  size_t pooled_works();
  // Offers `call` (its buffers of `kind`, `kind_out` kNoBuffer where the method takes one buffer)
  // on `device` and `stream`: 1 enqueued (*work), 0 not cached, -1 error (*err). `group`: the Python
  // backend, whose communicator publishes the cache's address once it made its device route.
  int offer(const pybind11::object& group, const CollectiveCall& call, uint8_t kind, uint8_t kind_out, int device,
            uintptr_t stream, std::shared_ptr<DeviceWork>* work, CoreError* err);
  // Holds `tensors` until `work`'s call retired (released on later calls, or at clear()), by its
  // retire ticket (core_api.h device_ticket), not the work itself.
  void hold(const std::shared_ptr<DeviceWork>& work, const at::Tensor& a, const at::Tensor& b);
  // (a batch's tensors: sends and receives, device_p2p.cc)
  void hold(const std::shared_ptr<DeviceWork>& work, std::vector<at::Tensor> tensors);
  void clear();
  size_t held();
  // The communicator's device call cache (null before its first device call). May take the GIL.
  void* cache(const pybind11::object& group);

 private:
  struct Held {
    DeviceTicket ticket;
    at::Tensor a, b;  // (a call's output and input; either undefined)
    std::vector<at::Tensor> more;  // (a batch's)
  };
  void hold(Held held);
  // Moves the tensors of retired calls into `out` (under mu_; the caller releases them after it).
  void take_retired(std::vector<at::Tensor>* out);
  const CoreApi* api_;
  std::atomic<void*> cache_{nullptr};  // DeviceCallCache*, kept alive by the group's communicator
  std::mutex mu_;  // never held while taking the GIL
  RingQueue<Held> held_;
  std::mutex pool_mu_;
  std::vector<c10::intrusive_ptr<CudaWork>> pool_;
  size_t next_ = 0;  // where the next look starts (works are let go of in about call order)
};

}  // namespace torch_backend
}  // namespace commlib
