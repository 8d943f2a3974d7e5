// Staged calls of CUDA tensors on the C++ backend (issue #44 item 3): non-contiguous tensors,
// reductions of dtypes or ops the core does not reduce, conjugate and negative views, the list
// forms of all_gather and reduce_scatter. The staging itself is staging.cc's, the code path CPU
// tensors take (ATen's copies, which torch enqueues on the current stream for CUDA tensors); what is
// CUDA's alone is here, the seam: the call offered to the device call cache on the current stream
// (as device_run offers an unstaged one), the copies back enqueued on that stream behind it, an
// event recorded after them so that the work is complete only once they ran, and the staged buffers
// held until the engine retired the call.
//
// Stream order makes the temporaries safe without recordStream: each is allocated on the current
// stream (the caching allocator's stream for it) and used only there (the copy in, the call, the
// copy back), and it is held until the engine saw the call retire; a later allocation reusing its
// block is ordered behind all of that on the same stream.
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

#include <memory>
#include <utility>

#include "torch_backend/backend.h"

namespace commlib {
namespace torch_backend {
namespace {

// The work of a staged device call: the call's own work (CudaWork), complete only once the copies
// back ran too (`copied`, recorded on the issuing stream behind them; null when they ran already,
// on the host, or there were none). wait() makes the waiter's stream wait for that event too (the
// call's own wait() skips its event once the call is seen complete, when the copies back may still
// be queued); getFuture() records its events on the issuing stream when first asked, which is after
// the copies back already.
class StagedWork : public c10d::Work {
 public:
  StagedWork(c10::intrusive_ptr<c10d::Work> call, std::unique_ptr<c10::Event> copied, int rank, c10d::OpType type)
      : c10d::Work(rank, type), call_(std::move(call)), copied_(std::move(copied)) {}
  bool isCompleted() override { return call_->isCompleted() && (!copied_ || copied_->query()); }
  bool isSuccess() const override { return call_->isSuccess() && (!copied_ || copied_->query()); }
  std::vector<at::Tensor> result() override { return call_->result(); }
  bool wait(std::chrono::milliseconds timeout) override {
    call_->wait(timeout);  // (raises the call's error)
    if (copied_) copied_->block(current_stream(c10::Device(copied_->device_type(), copied_->device_index())));
    return true;
  }
  void synchronize() override {
    call_->synchronize();
    if (copied_) copied_->synchronize();
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return call_->getFuture(); }

 private:
  c10::intrusive_ptr<c10d::Work> call_;
  std::unique_ptr<c10::Event> copied_;
};

}  // namespace

c10::intrusive_ptr<c10d::Work> CommlibBackend::device_staged(StagedCall s, uint8_t kind, bool two_buffers, int device,
                                                             uintptr_t stream_id, c10::Stream stream,
                                                             c10d::OpType type, const char* name,
                                                             std::vector<at::Tensor> outputs) {
  // (Nothing copied is still a call of its own: complex as pairs of reals. When the unstaged entry
  // offered these tensors already and the cache declined them, it declines them again.)
  hold_->flush();  // held host messages first, then those held on the Python side (p2p.py)
  if (p2p_handed_over_) flush_held_p2p();
  std::shared_ptr<DeviceWork> work;
  CoreError err;
  const int ran = devices_.offer(group_, s.call, kind, two_buffers ? kind : kNoBuffer, device, stream_id, &work, &err);
  if (ran < 0) raise_core_error(err, name, getRank());
  if (ran == 0) return nullptr;  // (the copies in went to buffers no one reads: the caller hands the call over)
  seq_.fetch_add(1);
  s.keep.insert(s.keep.end(), s.inputs.begin(), s.inputs.end());  // (held until the engine retired the call)
  devices_.hold(work, s.keep);
  const int me = getRank();
  auto call = c10::make_intrusive<CudaWork>(api_, type, name, me, std::move(outputs), work, stream);
  std::unique_ptr<c10::Event> copied;
  if (s.after) {
    if (stream.device_type() == c10::kCPU) {
      // The emulated seam (no c10 stream: its tensors are host views of emulated memory): the copies
      // back run on the host once the call ran, the order a CUDA stream gives them.
      CoreError e;
      if (!api_->device_synchronize(work, &e)) raise_core_error(e, name, me);
      s.after();
    } else {
      c10::StreamGuard on_stream(stream);
      at::AutoDispatchBelowADInplaceOrView below_autograd;
      s.after();  // enqueued on `stream`, behind the call
      copied = std::make_unique<c10::Event>(stream.device_type());
      copied->record(stream);
    }
  }
  return track(c10::make_intrusive<StagedWork>(std::move(call), std::move(copied), me, type));
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::cuda_staged(const at::Tensor& first, bool two_buffers,
                                                           c10d::OpType type, const char* name,
                                                           std::vector<at::Tensor> outputs,
                                                           const std::function<bool(const StageOn&, StagedCall*)>& build) {
  if (!first.defined() || !first.is_cuda()) return nullptr;
  StageOn on;
  on.device = first.device();
  const c10::Stream stream = current_stream(first.device());
  // Sends and receives held before this call go out before its copies in are enqueued: a receive
  // into a tensor this call reads must land before the copy reads it.
  hold_->flush();
  if (p2p_handed_over_) flush_held_p2p();
  StagedCall s;
  {
    c10::StreamGuard on_stream(stream);  // (the copies in: on the stream the call runs on)
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    if (!build(on, &s)) return nullptr;
  }
  return device_staged(std::move(s), kCudaBuffer, two_buffers, first.device().index(),
                       reinterpret_cast<uintptr_t>(stream.native_handle()), stream, type, name, std::move(outputs));
}

}  // namespace torch_backend
}  // namespace commlib
