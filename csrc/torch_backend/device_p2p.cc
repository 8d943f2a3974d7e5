// Sends and receives of CUDA tensors on the C++ backend (issue #44): held back with the host ones
// (P2PHold, p2p.h: the same rounds, so messages between two ranks keep their call order) and issued
// as the stream engine's batches, through the core's table (core_api.h device_p2p), on the stream
// that was current when the first message of the batch was called; the other messages' streams
// (when they differ) are made to wait before it. Ordered as torch's NCCL backend orders its
// sends and receives: after what their callers' streams did before the call, and a waiter's stream
// after the batch (CudaWork::wait).
//
// A batch goes through the Python path (Communicator.batch_p2p on that stream) only while the device
// route has no engine on that device: the route sets the engine up (a rendezvous of every rank), so
// every later batch on any stream of it runs from here (a stream no call ran on is wrapped in C++:
// bindings/device_p2p_streams.h). What the route would check besides (peers, one device, device buffers) is
// checked here before anything is held: the peer in range, one CUDA tensor.
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

#include <string>
#include <utility>
#include <vector>

#include "torch_backend/backend.h"

namespace py = pybind11;

namespace commlib {
namespace torch_backend {

// device_setup.cc: a first batch's engine set-up from C++ (1 set up, 0 nothing done, -1 err).
int set_up_device_p2p(void* cache, const std::vector<P2PItem>& items, DType dtype, uint8_t kind, int device,
                      uintptr_t stream, CoreError* err);


bool device_p2p_layout(const at::Tensor& t) {
  // (an expanded view too: sent from a contiguous copy; a receive into one fails at its copy back
  // with torch's error, as on the CPU path: backend.cc host_layout)
  return t.defined() && t.is_cuda() && t.layout() == at::kStrided && !t.is_conj() && !t.is_neg();
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::hold_device_message(bool send, const at::Tensor& t, int peer,
                                                                    uint8_t kind, int device, uintptr_t stream_id,
                                                                    c10::Stream stream) {
  const c10d::OpType type = send ? c10d::OpType::SEND : c10d::OpType::RECV;
  const char* name = send ? "send" : "recv";
  seq_.fetch_add(1);
  if (t.nbytes() == 0)  // nothing to move (nor does the peer): complete at once
    return track(c10::make_intrusive<CudaWork>(api_, type, name, getRank(), std::vector<at::Tensor>{t}, nullptr, stream));
  // A non-contiguous tensor moves through a contiguous copy: a send's is made now on the caller's
  // stream, a receive's is copied back on the issuing stream after the batch.
  at::Tensor c = dense(t);
  auto msg = std::make_shared<DeviceMessage>(
      DeviceMessage{kind, device, stream_id, stream, (send || c.is_same(t)) ? at::Tensor() : t, nullptr});
  std::weak_ptr<P2PHold> weak = hold_;
  msg->work = c10::make_intrusive<CudaWork>(api_, type, name, getRank(), std::vector<at::Tensor>{t}, stream, [weak] {
    if (auto hold = weak.lock()) hold->flush();
  });
  auto work = msg->work;
  hold_->hold_device(send, std::move(c), peer, std::move(msg));
  return track(work);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::cuda_p2p(bool send, const at::Tensor& t, int peer) {
  const c10::Stream stream = current_stream(t.device());
  return hold_device_message(send, t, peer, kCudaBuffer, t.device().index(),
                             reinterpret_cast<uintptr_t>(stream.native_handle()), stream);
}

namespace {

// The kind of a Python error of the core's (the bindings' classes), for a CoreError.
uint32_t kind_of_python_error(const CoreApi* api, const py::error_already_set& e) {
  // (subclasses before their bases: StoreLostError is a RendezvousError, which is a CommError)
  for (uint32_t kind : {kCoreStoreLostError, kCoreRendezvousError, static_cast<uint32_t>(ErrorKind::Mismatch),
                        static_cast<uint32_t>(ErrorKind::Peer), static_cast<uint32_t>(ErrorKind::Comm),
                        kCoreInvalidArgument, kCoreNoMemory}) {
    PyObject* cls = api->error_class(kind);
    if (cls != nullptr && PyObject_IsInstance(e.value().ptr(), cls) == 1) return kind;
  }
  return kCoreOtherError;
}

}  // namespace

bool CommlibBackend::python_batch(const std::vector<P2PHold::Held*>& round, std::shared_ptr<DeviceWork>* work,
                                  CoreError* err) {
  const DeviceMessage& first = *round[0]->device;
  if (first.kind != kCudaBuffer) {  // (the test seam's emulated memory: the route has no tensor of it)
    *err = {kCoreOtherError, "the device route has not set its engine up on this device yet"};
    return false;
  }
  if (!Py_IsInitialized()) {  // (held messages flushed while the interpreter is gone: no Python path)
    *err = {kCoreOtherError, "the interpreter is finalizing"};
    return false;
  }
  py::gil_scoped_acquire gil;
  try {
    c10::StreamGuard on_issuing(first.stream);  // the route enqueues on the current stream, and remembers it
    py::list ops;
    for (P2PHold::Held* h : round) ops.append(py::make_tuple(h->send ? "send" : "recv", h->tensor, h->peer));
    py::object w = group_.attr("_comm").attr("batch_p2p")(ops, py::arg("async_op") = true);
    if (api_->device_work_of(w.ptr(), work)) return true;
    *err = {kCoreOtherError, "the Python path's batch_p2p returned no device work"};
  } catch (py::error_already_set& e) {
    *err = {kind_of_python_error(api_, e), py::str(e.value())};
  }
  return false;
}

bool CommlibBackend::issue_device_round(const std::vector<P2PHold::Held*>& round, CoreError* err,
                                        const DeviceBatch* a2av) {
  const DeviceMessage& first = *round[0]->device;
  const c10::Stream s = first.stream;
  const bool numbered = a2av != nullptr && a2av->a2av_count >= 0;  // an all-to-all: numbered as a collective
  const DType dt = numbered ? a2av->dtype : DType::UInt8;
  // 1 enqueued, 0 no engine on the stream's device yet, -1 err (core_api.h)
  auto enqueue = [&](void* cache, const std::vector<P2PItem>& items, std::shared_ptr<DeviceWork>* work) {
    return numbered ? api_->device_all_to_allv(cache, items.data(), items.size(), dt, a2av->a2av_count, first.kind,
                                               first.device, first.stream_id, work, err)
                    : api_->device_p2p(cache, items.data(), items.size(), dt, first.kind, first.device,
                                       first.stream_id, work, err);
  };
  std::vector<P2PItem> items;
  std::vector<at::Tensor> keep;  // held until the engine retired the batch
  for (P2PHold::Held* h : round) {
    if (h->device->stream != s) {  // its caller's stream: what it enqueued so far goes first
      c10::Event event(s.device_type());
      event.record(h->device->stream);
      event.block(s);
    }
    items.push_back(P2PItem{h->send, reinterpret_cast<uintptr_t>(h->tensor.data_ptr()),
                            static_cast<int64_t>(h->tensor.nbytes() / element_bytes(dt)), h->peer});
    keep.push_back(h->tensor);
  }
  std::shared_ptr<DeviceWork> work;
  void* cache = devices_.cache(group_);
  int ran = cache == nullptr ? 0 : enqueue(cache, items, &work);
  if (ran == 0 && cache != nullptr) {  // no engine on the device yet: set it up from C++ (device_setup.cc)
    const int set_up = set_up_device_p2p(cache, items, dt, first.kind, first.device, first.stream_id, err);
    if (set_up < 0) return false;
    if (set_up > 0) ran = enqueue(cache, items, &work);
  }
  // (the Python path's batch, where C++ cannot set the engine up: CUDA without commlib._C_cuda; an
  // all-to-all's batch is then a plain one there, unnumbered)
  if (ran < 0 || (ran == 0 && !python_batch(round, &work, err))) return false;
  {  // receives that landed in a contiguous copy: copied back on the issuing stream, after the batch
    c10::StreamGuard on_issuing(s);
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // (as run_finish: never recorded by autograd)
    for (P2PHold::Held* h : round) {
      at::Tensor& user = h->device->user;
      if (!user.defined()) continue;
      user.copy_(h->tensor);
      user.record_stream(s);  // both used on `s`: the allocator must not hand them out before it ran
      h->tensor.record_stream(s);
    }
  }
  devices_.hold(work, std::move(keep));
  for (P2PHold::Held* h : round) h->device->work->issue(work, s);
  return true;
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::device_exchange(const at::Tensor& in, const at::Tensor& out,
                                                               const std::vector<int64_t>& in_bytes,
                                                               const std::vector<int64_t>& out_bytes, DType dt,
                                                               uint8_t kind, int device, uintptr_t stream_id,
                                                               c10::Stream stream, at::Tensor user) {
  const int me = getRank(), P = getSize();
  if (in_bytes[me] != out_bytes[me])
    throw py::value_error("input_split_sizes/output_split_sizes: this rank sends itself " + std::to_string(in_bytes[me]) +
                          " bytes but expects " + std::to_string(out_bytes[me]));
  const at::Tensor ib = in.reshape({-1}).view(at::kByte), ob = out.reshape({-1}).view(at::kByte);
  std::vector<int64_t> in_off(P, 0), out_off(P, 0);
  for (int j = 1; j < P; ++j) {
    in_off[j] = in_off[j - 1] + in_bytes[j - 1];
    out_off[j] = out_off[j - 1] + out_bytes[j - 1];
  }
  // In the order the Python path plans it (commlib/core/p2p_plan.py: per peer a send, then a
  // receive; empty blocks included); this rank's own block copied on the stream first, as the
  // Python path's route copies it; a non-contiguous output copied back after the batch.
  DeviceBatch b;
  for (int j = 0; j < P; ++j) {
    if (j == me) continue;
    b.messages.push_back({true, ib.narrow(0, in_off[j], in_bytes[j]), j});
    b.messages.push_back({false, ob.narrow(0, out_off[j], out_bytes[j]), j});
  }
  b.own = {ob.narrow(0, out_off[me], out_bytes[me]), ib.narrow(0, in_off[me], in_bytes[me])};
  b.dtype = dt;  // numbered as a collective, as the Python path's batch (device_route.py p2p's a2av_count)
  b.a2av_count = static_cast<int64_t>(in.nbytes() / element_bytes(dt));
  if (user.defined()) b.back.emplace_back(user, out);
  return device_batch(std::move(b), c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {user.defined() ? user : out},
                      kind, device, stream_id, stream);
}

}  // namespace torch_backend
}  // namespace commlib
