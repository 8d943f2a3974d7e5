// CUDA tensors on the C++ backend (torch_backend/device_calls.h): DeviceCalls and the backend's
// calls that offer CUDA tensors to the device call cache (CudaWork: device_call_work.cc).
#include "torch_backend/device_calls.h"

#include <ATen/core/ivalue.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "torch_backend/backend.h"
#include "torch_backend/tensor_for_core.h"

namespace py = pybind11;

namespace commlib {
namespace torch_backend {

// device_setup.cc: the first call's engine set-up from C++ (bindings/device_setup_api.h's answer).
int set_up_device(void* cache, const CollectiveCall& call, uint8_t kind, uint8_t kind_out, int device, uintptr_t stream,
                  CoreError* err);

bool device_layout(const at::Tensor& t) {
  return t.defined() && t.is_cuda() && t.layout() == at::kStrided && t.is_contiguous() && !t.is_conj() &&
         !t.is_neg();
}

c10::Stream current_stream(c10::Device device) {
  // The device-generic guard: CUDA's implementation is registered by torch's CUDA library, so no
  // CUDA header or libc10_cuda is needed here (a CPU build of torch never reaches this).
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

// -- DeviceCalls -----------------------------------------------------------------------------------
void* DeviceCalls::cache(const py::object& group) {
  void* c = cache_.load(std::memory_order_acquire);
  if (c != nullptr) return c;
  // Published by the communicator once its device route exists (native.wrap makes it with the
  // backend, which reads it at construction); the route lives as long as the communicator.
  py::gil_scoped_acquire gil;
  py::object address = group.attr("_comm").attr("_device_calls");
  if (address.is_none()) return nullptr;
  c = reinterpret_cast<void*>(address.cast<uintptr_t>());
  cache_.store(c, std::memory_order_release);
  return c;
}

int DeviceCalls::offer(const py::object& group, const CollectiveCall& call, uint8_t kind, uint8_t kind_out, int device,
                       uintptr_t stream, std::shared_ptr<DeviceWork>* work, CoreError* err) {
  void* c = cache(group);
  if (c == nullptr) return 0;
  const int ran = api_->device_collective(c, call, kind, kind_out, device, stream, work, err);
  // Declined with no engine on the device yet (the group's first call there): set it up from C++
  // (device_setup.cc) and offer the call again; else 0 (the Python backend explains the call).
  const int set_up = ran == 0 ? set_up_device(c, call, kind, kind_out, device, stream, err) : 0;
  if (set_up <= 0) return ran != 0 ? ran : set_up;
  return api_->device_collective(c, call, kind, kind_out, device, stream, work, err);
}

c10::intrusive_ptr<CudaWork> DeviceCalls::work_for(const CoreApi* api, c10d::OpType type, const char* name, int rank,
                                                   const at::Tensor& output, std::shared_ptr<DeviceWork> work,
                                                   c10::Stream issued) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  for (size_t looked = 0; looked < pool_.size(); ++looked) {
    if (next_ >= pool_.size()) next_ = 0;
    c10::intrusive_ptr<CudaWork>& w = pool_[next_];
    next_ = next_ + 1 == pool_.size() ? 0 : next_ + 1;
    if (w.use_count() == 1 && w.weak_use_count() == 1) {
      // The last release by another owner (an acq_rel decrement) happens before the re-arm.
      std::atomic_thread_fence(std::memory_order_acquire);
      w->rearm(type, name, output, std::move(work), issued);
      return w;
    }
  }
  std::vector<at::Tensor> outputs;
  if (output.defined()) outputs.push_back(output);
  auto fresh = c10::make_intrusive<CudaWork>(api, type, name, rank, std::move(outputs), std::move(work), issued);
  if (pool_.size() < kMaxWorks) {
    if (pool_.capacity() < kMaxWorks) pool_.reserve(kMaxWorks);
    pool_.push_back(fresh);
  }
  return fresh;
}

size_t DeviceCalls::pooled_works() {
  std::lock_guard<std::mutex> lock(pool_mu_);
  return pool_.size();
}

void DeviceCalls::take_retired(std::vector<at::Tensor>* out) {
  while (!held_.empty() && api_->device_ticket_retired(held_.front().ticket)) {
    Held& h = held_.front();
    out->push_back(std::move(h.a));
    out->push_back(std::move(h.b));
    for (auto& t : h.more) out->push_back(std::move(t));
    held_.pop_front();
  }
}

namespace {
// The tensors of retired calls, released after the lock (a tensor with a Python object takes the
// GIL to go); one per thread, whose capacity stays, so a steady call allocates nothing for it.
std::vector<at::Tensor>& releasing() {
  thread_local std::vector<at::Tensor> tensors;
  return tensors;
}
}  // namespace

void DeviceCalls::hold(const std::shared_ptr<DeviceWork>& work, const at::Tensor& a, const at::Tensor& b) {
  Held h{DeviceTicket(), a, b, {}};
  api_->device_ticket(work, &h.ticket);  // (not the work: the core re-arms a work once only its pool owns it)
  hold(std::move(h));
}

void DeviceCalls::hold(const std::shared_ptr<DeviceWork>& work, std::vector<at::Tensor> tensors) {
  Held h{DeviceTicket(), at::Tensor(), at::Tensor(), std::move(tensors)};
  api_->device_ticket(work, &h.ticket);
  hold(std::move(h));
}

void DeviceCalls::hold(Held h) {
  std::vector<at::Tensor>& retired = releasing();
  {
    std::lock_guard<std::mutex> lock(mu_);
    take_retired(&retired);
    held_.push_back(std::move(h));
  }
  retired.clear();
}

size_t DeviceCalls::held() {
  std::vector<at::Tensor>& retired = releasing();
  size_t n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    take_retired(&retired);
    n = held_.size();
  }
  retired.clear();
  return n;
}

void DeviceCalls::clear() {
  RingQueue<Held> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(all, held_);
  }
  std::lock_guard<std::mutex> lock(pool_mu_);
  pool_.clear();  // (a work a caller still holds lives on without the pool)
}

// -- the backend's calls on CUDA tensors ---------------------------------------------------------

c10::intrusive_ptr<c10d::Work> CommlibBackend::device_run(const CollectiveCall& call, uint8_t kind, bool two_buffers,
                                                          int device, uintptr_t stream_id, c10::Stream issued,
                                                          c10d::OpType type, const char* name, const at::Tensor& output,
                                                          const at::Tensor& input) {
  hold_->flush();  // held host messages first, then those held on the Python side (p2p.py)
  if (p2p_handed_over_) flush_held_p2p();
  std::shared_ptr<DeviceWork> work;
  CoreError err;
  const int ran = devices_.offer(group_, call, kind, two_buffers ? kind : kNoBuffer, device, stream_id, &work, &err);
  if (ran < 0) raise_core_error(err, name, getRank());
  if (ran == 0) return nullptr;
  seq_.fetch_add(1);
  devices_.hold(work, output, input);
  return track(devices_.work_for(api_, type, name, getRank(), output, std::move(work), issued));
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::cuda_call(const CollectiveCall& call, bool two_buffers,
                                                         const at::Tensor& first, c10d::OpType type, const char* name,
                                                         const at::Tensor& output, const at::Tensor& input) {
  const c10::Stream stream = current_stream(first.device());
  return device_run(call, kCudaBuffer, two_buffers, first.device().index(), reinterpret_cast<uintptr_t>(stream.native_handle()),
                    stream, type, name, output, input);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::cuda_reduction(Collective c, std::vector<at::Tensor>& t,
                                                              const c10d::ReduceOp& reduce_op, int root,
                                                              c10d::OpType type, const char* name) {
  DType dt;
  RedOp op;
  double scale = 1.0;
  if (t.size() != 1 || !device_layout(t[0]) || !reduction_dtype(t[0], &dt) || !reduction_op(reduce_op, dt, &op, &scale))
    return nullptr;
  auto call = make_call(c, algo(c), dt, t[0].numel(), address(t[0]), address(t[0]), c == Collective::Reduce ? root : 0);
  call.op = op;
  if (op == RedOp::PremulSum) call.scale = scale;
  return cuda_call(call, false, t[0], type, name, t[0], at::Tensor());
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::cuda_broadcast(std::vector<at::Tensor>& t, int root) {
  if (t.size() != 1 || !device_layout(t[0])) return nullptr;
  DType dt;
  int64_t n;
  moved_as(t[0], &dt, &n);
  auto call = make_call(Collective::Broadcast, algo(Collective::Broadcast), dt, n, address(t[0]), address(t[0]), root);
  return cuda_call(call, false, t[0], c10d::OpType::BROADCAST, "broadcast", t[0], at::Tensor());
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::cuda_allgather_base(at::Tensor& out, at::Tensor& in) {
  if (!device_layout(in) || !device_layout(out) || in.device() != out.device() ||
      in.scalar_type() != out.scalar_type() || out.numel() != in.numel() * getSize())
    return nullptr;
  DType dt;
  int64_t n;
  moved_as(in, &dt, &n);
  auto call = make_call(Collective::AllGather, algo(Collective::AllGather), dt, n, address(in), address(out));
  return cuda_call(call, true, in, c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", out, in);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::cuda_reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                                        const c10d::ReduceOp& reduce_op) {
  DType dt;
  RedOp op;
  double scale = 1.0;
  if (!device_layout(in) || !device_layout(out) || in.device() != out.device() ||
      in.scalar_type() != out.scalar_type() || in.numel() != out.numel() * getSize() || !reduction_dtype(out, &dt) ||
      !reduction_op(reduce_op, dt, &op, &scale))
    return nullptr;
  auto call =
      make_call(Collective::ReduceScatter, algo(Collective::ReduceScatter), dt, out.numel(), address(in), address(out));
  call.op = op;
  if (op == RedOp::PremulSum) call.scale = scale;
  return cuda_call(call, true, in, c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", out, in);
}

// -- coalesced calls on CUDA tensors: each tensor (pair) as its own call, from C++ where the cache
// holds it, else handed to the Python backend's single-tensor method (which runs it as its coalesced
// method would: one call per tensor or pair), in order; one CoalescedWork over them. Only when every
// tensor is on the first one's CUDA device (the Python side explains mixtures).
namespace {

bool on_one_cuda_device(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.empty() || !a[0].defined() || !a[0].is_cuda()) return false;
  for (const auto* ts : {&a, &b})
    for (const auto& t : *ts)
      if (!t.defined() || t.device() != a[0].device()) return false;
  return true;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> CommlibBackend::cuda_coalesced(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                                              const std::function<WorkPtr(size_t)>& from_cpp,
                                                              const std::function<WorkPtr(size_t)>& hand_over) {
  if (in.size() != out.size() || !on_one_cuda_device(in, out)) return nullptr;
  std::vector<WorkPtr> works;
  works.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    WorkPtr w = from_cpp(i);
    works.push_back(w ? std::move(w) : hand_over(i));
  }
  return c10::make_intrusive<CoalescedWork>(getRank(), std::move(works));
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::cuda_alltoall_base(at::Tensor& out, at::Tensor& in) {
  // (the Python path runs equal blocks as the core's all_to_all over the tensors' flat views, or
  // their bytes; an input that is the output it copies first, so that case is never cached)
  if (!device_layout(in) || !device_layout(out) || in.device() != out.device() ||
      in.scalar_type() != out.scalar_type() || in.numel() != out.numel() || in.data_ptr() == out.data_ptr())
    return nullptr;
  DType dt;
  int64_t n;
  moved_as(in, &dt, &n);
  if (n % getSize() != 0) return nullptr;
  auto call = make_call(Collective::AllToAll, algo(Collective::AllToAll), dt, n / getSize(), address(in), address(out));
  return cuda_call(call, true, in, c10d::OpType::ALLTOALL_BASE, "all_to_all_single", out, in);
}

}  // namespace torch_backend
}  // namespace commlib
