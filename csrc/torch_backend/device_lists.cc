// gather, scatter and the list all_to_all of CUDA tensors on the C++ backend (issue #44): each as
// one batch of the stream engine on the caller's current stream, as torch's NCCL backend runs them
// (ncclSend/ncclRecv in one group), through the issue CUDA sends and receives take
// (device_p2p.cc issue_device_round: from C++ on any stream of an engine the device route set up,
// else once through Communicator.batch_p2p, which sets the engine up). The uneven all_to_all_single
// (device_exchange) is the same batch.
//
// Every rank of a group runs a CUDA call of these here (the C++ backend is every rank's), so no rank
// runs one as the core's gather while a peer sends: a call is handed to the Python backend only for
// an argument error, which it explains (a root out of range, a root's list of the wrong length, size,
// dtype or layout, tensors on two devices); never for a layout this batch can move. Tensors it cannot
// move as they lie (not contiguous, on another device, conjugate or negative views) move through a
// contiguous copy on the call's device: a send's made at the call on the current stream, a
// receive's copied back on it after the batch. Nothing is staged through one flat buffer.
#include <ATen/MemoryOverlap.h>  // (at::get_overlap_status: torch 2.11 declares it here alone)
#include <c10/core/StreamGuard.h>

#include <string>
#include <utility>
#include <vector>

#include "torch_backend/backend.h"

namespace py = pybind11;

namespace commlib {
namespace torch_backend {
namespace {

// The allocator must not hand `t` out again before what `s` has enqueued ran.
void used_on(const at::Tensor& t, c10::Stream s) {
  if (t.defined() && t.is_cuda()) t.record_stream(s);
}

// What a send of `t` moves: `t` when the batch reads it as it lies, else a contiguous copy of its
// values on `device` (made now, on the current stream, which the batch runs on).
at::Tensor send_source(const at::Tensor& t, c10::Device device) {
  if (t.device() == device && t.is_contiguous() && !t.is_conj() && !t.is_neg()) return t;
  return t.to(device).resolve_conj().resolve_neg().contiguous();
}

// Where a receive into `t` lands: `t` when the batch can write it as it lies, else a contiguous
// tensor on `device`, copied into `t` after the batch (DeviceBatch::back).
at::Tensor receive_target(const at::Tensor& t, c10::Device device, DeviceBatch* batch) {
  if (t.device() == device && t.is_contiguous() && !t.is_conj() && !t.is_neg()) return t;
  at::Tensor staged = at::empty(t.sizes(), t.options().device(device).memory_format(at::MemoryFormat::Contiguous));
  batch->back.emplace_back(t, staged);
  return staged;
}

// A tensor of a list the batch moves: strided, and of `like`'s element count and dtype.
bool like(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() && t.layout() == at::kStrided && t.numel() == like.numel() &&
         t.scalar_type() == like.scalar_type();
}

bool strided_cuda(const at::Tensor& t) { return t.defined() && t.is_cuda() && t.layout() == at::kStrided; }

}  // namespace

DeviceBatch rooted_batch(const at::Tensor& mine, const std::vector<at::Tensor>& list, int root, int me,
                         bool root_receives) {
  // gather (root_receives): every rank sends `mine` to the root, which receives block j into
  // list[j]; scatter: the root sends list[j] to rank j, which receives it into `mine`. The root's own
  // block is a copy on the stream: list[me] <- mine (gather), mine <- list[me] (scatter).
  DeviceBatch b;
  if (me != root) {
    b.messages.push_back({root_receives, mine, root});
    return b;
  }
  for (int j = 0; j < static_cast<int>(list.size()); ++j)
    if (j != me) b.messages.push_back({!root_receives, list[j], j});
  b.own = root_receives ? std::make_pair(list[me], mine) : std::make_pair(mine, list[me]);
  return b;
}

DeviceBatch alltoall_batch(const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>& ins, int me) {
  DeviceBatch b;
  for (int j = 0; j < static_cast<int>(ins.size()); ++j) {
    if (j == me) continue;
    b.messages.push_back({true, ins[j], j});  // per peer a send, then a receive (as p2p_plan.py)
    b.messages.push_back({false, outs[j], j});
  }
  b.own = {outs[me], ins[me]};
  // numbered as a collective, as the Python backend's list all-to-all (its _alltoallv) is
  b.dtype = ins.empty() ? DType::UInt8 : a_to_a_dtype(ins[0]);
  b.a2av_count = 0;
  for (const auto& t : ins) b.a2av_count += static_cast<int64_t>(t.nbytes() / element_bytes(b.dtype));
  return b;
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::device_batch(DeviceBatch batch, c10d::OpType type, const char* name,
                                                            std::vector<at::Tensor> outputs, uint8_t kind, int device,
                                                            uintptr_t stream_id, c10::Stream stream) {
  hold_->flush();  // every message held before it goes first (as for any call)
  if (p2p_handed_over_) flush_held_p2p();
  seq_.fetch_add(1);
  const int me = getRank();
  auto work = c10::make_intrusive<CudaWork>(api_, type, name, me, std::move(outputs), stream, nullptr);
  if (batch.own.first.defined()) {  // this rank's own block, on the stream, before the batch
    c10::StreamGuard on_stream(stream);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    batch.own.first.reshape({-1}).copy_(batch.own.second.reshape({-1}));
    used_on(batch.own.first, stream);
    used_on(batch.own.second, stream);
  }
  // One round: at most one send to and one receive from each peer.
  auto msg = std::make_shared<DeviceMessage>(DeviceMessage{kind, device, stream_id, stream, at::Tensor(), work});
  std::vector<P2PHold::Held> held;
  for (auto& m : batch.messages) held.push_back({m.send, m.tensor, m.peer, nullptr, msg});
  std::vector<P2PHold::Held*> round;
  for (auto& h : held) round.push_back(&h);
  CoreError err;
  if (round.empty())
    work->issue(nullptr, stream);  // one rank: its own block was all
  else if (!issue_device_round(round, &err, &batch))
    raise_core_error(err, name, me);
  if (!batch.back.empty()) {  // receives that landed in a contiguous copy: copied back after the batch
    c10::StreamGuard on_stream(stream);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (auto& [user, staged] : batch.back) {
      user.copy_(staged);
      used_on(user, stream);
      used_on(staged, stream);
    }
  }
  return track(work);
}

// -- the backend's entries for CUDA tensors: null when the call is not one (a CPU tensor), or on an
// argument error (the Python backend then raises it, naming the argument) -------------------------
c10::intrusive_ptr<c10d::Work> CommlibBackend::cuda_gather(std::vector<std::vector<at::Tensor>>& out,
                                                           std::vector<at::Tensor>& in, int root) {
  if (in.size() != 1 || !strided_cuda(in[0]) || root < 0 || root >= getSize()) return nullptr;
  const int me = getRank();
  const c10::Device dev = in[0].device();
  DeviceBatch staging;
  std::vector<at::Tensor> targets, outputs;
  if (me == root) {
    if (out.size() != 1 || out[0].size() != static_cast<size_t>(getSize())) return nullptr;
    for (const auto& t : out[0])
      if (!like(t, in[0])) return nullptr;
    for (const auto& t : out[0]) targets.push_back(receive_target(t, dev, &staging));
    outputs = out[0];
  }
  DeviceBatch b = rooted_batch(send_source(in[0], dev), targets, root, me, true);
  b.back = std::move(staging.back);
  const c10::Stream s = current_stream(dev);
  return device_batch(std::move(b), c10d::OpType::GATHER, "gather", std::move(outputs), kCudaBuffer, dev.index(),
                      reinterpret_cast<uintptr_t>(s.native_handle()), s);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::cuda_scatter(std::vector<at::Tensor>& out,
                                                            std::vector<std::vector<at::Tensor>>& in, int root) {
  if (out.size() != 1 || !strided_cuda(out[0]) || root < 0 || root >= getSize()) return nullptr;
  const int me = getRank();
  const c10::Device dev = out[0].device();
  std::vector<at::Tensor> sources;
  if (me == root) {
    if (in.size() != 1 || in[0].size() != static_cast<size_t>(getSize())) return nullptr;
    for (const auto& t : in[0])
      if (!like(t, out[0])) return nullptr;
    for (const auto& t : in[0]) sources.push_back(send_source(t, dev));
  }
  DeviceBatch staging;
  const at::Tensor mine = receive_target(out[0], dev, &staging);
  DeviceBatch b = rooted_batch(mine, sources, root, me, false);
  b.back = std::move(staging.back);
  const c10::Stream s = current_stream(dev);
  return device_batch(std::move(b), c10d::OpType::SCATTER, "scatter", out, kCudaBuffer, dev.index(),
                      reinterpret_cast<uintptr_t>(s.native_handle()), s);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::cuda_alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in) {
  const size_t P = static_cast<size_t>(getSize());
  if (in.size() != P || out.size() != P || !strided_cuda(in[0])) return nullptr;
  const c10::Device dev = in[0].device();
  for (const auto* ts : {&in, &out})
    for (const auto& t : *ts)
      if (!strided_cuda(t) || t.device() != dev || t.scalar_type() != in[0].scalar_type()) return nullptr;
  const int me = getRank();
  if (in[me].numel() != out[me].numel())
    throw py::value_error("output_tensor_list[" + std::to_string(me) + "]: has " + std::to_string(out[me].numel()) +
                          " elements, but this rank sends itself " + std::to_string(in[me].numel()) +
                          " (input_tensor_list[" + std::to_string(me) + "])");
  DeviceBatch b;
  std::vector<at::Tensor> ins, outs;
  for (size_t j = 0; j < P; ++j) {
    at::Tensor src = send_source(in[j], dev);
    for (const auto& o : out)  // an input that is (part of) an output: sent from a copy
      if (src.is_same(in[j]) && at::get_overlap_status(o, in[j]) != at::MemOverlapStatus::No) {
        src = in[j].clone(at::MemoryFormat::Contiguous);
        break;
      }
    ins.push_back(src);
    outs.push_back(receive_target(out[j], dev, &b));
  }
  DeviceBatch batch = alltoall_batch(outs, ins, me);
  batch.back = std::move(b.back);
  const c10::Stream s = current_stream(dev);
  return device_batch(std::move(batch), c10d::OpType::ALLTOALL, "all_to_all", out, kCudaBuffer, dev.index(),
                      reinterpret_cast<uintptr_t>(s.native_handle()), s);
}

}  // namespace torch_backend
}  // namespace commlib
