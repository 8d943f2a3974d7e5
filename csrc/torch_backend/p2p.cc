// P2PHold (torch_backend/p2p.h) and CommlibBackend's send, recv, recvAnysource and coalescing
// blocks (startCoalescing/endCoalescing: batch_isend_irecv's one work).
#include "torch_backend/p2p.h"

#include <map>
#include <tuple>
#include <string>
#include <utility>

#include "torch_backend/backend.h"

namespace py = pybind11;

namespace commlib {
namespace torch_backend {

void P2PHold::hold(bool send, at::Tensor t, int peer, c10::intrusive_ptr<CommlibWork> work) {
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_) return work->fail({kCoreOtherError, "the process group was shut down"});
  held_.push_back({send, std::move(t), peer, std::move(work), nullptr});
  pending_.store(true, std::memory_order_release);
}

void P2PHold::hold_device(bool send, at::Tensor t, int peer, std::shared_ptr<DeviceMessage> device) {
  std::lock_guard<std::mutex> lk(mu_);
  if (closed_) return device->work->fail({kCoreOtherError, "the process group was shut down"});
  held_.push_back({send, std::move(t), peer, nullptr, std::move(device)});
  pending_.store(true, std::memory_order_release);
}

namespace {

// The lock order is the hold's mutex, then the GIL: a flush takes the GIL under the mutex (a CUDA
// batch on a device the device route has no engine on yet goes through Python, python_batch; the
// device call cache's address is read from Python once). So a thread that holds the GIL when it
// flushes (torch's binding of Work.get_future keeps it; a backend dropped from Python closes its hold)
// lets the GIL go while it waits for the mutex and flushes, and takes it back after; else it could
// wait for the mutex while the thread that holds it waits for the GIL.
class WithoutGil {
 public:
  WithoutGil() {
    if (Py_IsInitialized() && PyGILState_Check()) saved_ = PyEval_SaveThread();
  }
  ~WithoutGil() {
    if (saved_ != nullptr) PyEval_RestoreThread(saved_);
  }
  WithoutGil(const WithoutGil&) = delete;
  WithoutGil& operator=(const WithoutGil&) = delete;

 private:
  PyThreadState* saved_ = nullptr;
};

}  // namespace

void P2PHold::flush() {
  if (!pending()) return;
  WithoutGil nogil;
  std::lock_guard<std::mutex> lk(mu_);
  flush_locked();
}

void P2PHold::close() {
  WithoutGil nogil;
  std::lock_guard<std::mutex> lk(mu_);
  flush_locked();
  closed_ = true;
}

void P2PHold::while_locked(const std::function<void()>& f) {
  WithoutGil nogil;
  std::lock_guard<std::mutex> lk(mu_);
  f();
}

bool P2PHold::issue_host(const std::vector<Held*>& round, CoreError* err) {
  std::vector<P2PItem> items;
  for (Held* h : round)
    items.push_back(P2PItem{h->send, reinterpret_cast<uintptr_t>(h->tensor.data_ptr()),
                            static_cast<int64_t>(h->tensor.nbytes()), h->peer});
  std::shared_ptr<commlib::Work> work;
  if (!api_->p2p(core_, items.data(), items.size(), DType::UInt8, true, 0.0, &work, err)) return false;
  host_batches_.fetch_add(1, std::memory_order_relaxed);
  for (Held* h : round) {
    h->work->issue(work);
    completer_->put(h->work);
  }
  return true;
}

void P2PHold::flush_locked() {
  std::vector<Held> held;
  held.swap(held_);
  pending_.store(false, std::memory_order_release);
  if (held.empty()) return;
  // A place: the host ({-1, -1}) or a device (kind, index); its rounds; places in order of appearance.
  using Place = std::pair<int, int>;
  std::vector<Place> places;
  std::map<Place, std::vector<std::vector<Held*>>> rounds;
  std::map<std::tuple<Place, bool, int>, size_t> seen;
  for (Held& h : held) {
    const Place place = h.device ? Place{h.device->kind, h.device->device} : Place{-1, -1};
    auto it = rounds.find(place);
    if (it == rounds.end()) {
      places.push_back(place);
      it = rounds.emplace(place, std::vector<std::vector<Held*>>{}).first;
    }
    // (the host: one batch, in call order; a device: the k-th message of each (kind, peer) in batch k)
    const size_t k = place.first < 0 ? 0 : seen[{place, h.send, h.peer}]++;
    if (k == it->second.size()) it->second.emplace_back();
    it->second[k].push_back(&h);
  }
  for (const Place& place : places) {
    bool failed = false;
    CoreError err;
    for (auto& round : rounds[place]) {
      if (!failed) failed = !(place.first < 0 ? issue_host(round, &err) : device_issuer_(round, &err));
      if (!failed) continue;
      for (Held* h : round) {  // this batch and every later one of this place
        if (h->device)
          h->device->work->fail(err);
        else
          h->work->fail(err);
      }
    }
  }
}

namespace {

// One CPU tensor, as the core can move it once contiguous (host_layout); others are handed over.
bool host_tensor(const std::vector<at::Tensor>& t) { return t.size() == 1 && host_layout(t[0]); }

// A sparse (any non-strided) tensor is refused before anything is held, as gloo refuses it ("input
// tensor has to be contiguous") and NCCL too; torch's dist.send/recv (and so batch_isend_irecv)
// have no sparse kernel, so only a caller of the backend's own methods gets here. The Python
// backend refuses it with the same message (p2p.py's check_p2p_tensors).
void refuse_sparse(const std::vector<at::Tensor>& t, const char* kind) {
  if (!t.empty() && t[0].defined() && t[0].layout() != at::kStrided)
    throw py::value_error(std::string("tensors: a ") + kind +
                          " of a sparse tensor is not supported, as on gloo and NCCL; move its indices() and "
                          "values() as dense tensors");
}

}  // namespace

c10::intrusive_ptr<c10d::Work> CommlibBackend::p2p(bool send, std::vector<at::Tensor>& t, int peer) {
  if (t.size() != 1)  // (as gloo and NCCL: torch's own API passes one)
    throw py::value_error(std::string("tensors: a ") + (send ? "send" : "recv") + " takes one tensor, got " +
                          std::to_string(t.size()));
  refuse_sparse(t, send ? "send" : "recv");
  const bool on_device = device_p2p_layout(t[0]);
  if (!host_tensor(t) && !on_device) {  // (other devices; conj/neg views, resolved by torch's API first)
    p2p_handed_over_ = true;
    return send ? delegate("send", t, peer, 0) : delegate("recv", t, peer, 0);
  }
  const char* kind = send ? "send" : "recv";
  if (peer < 0 || peer >= getSize() || peer == getRank())
    throw py::value_error(std::string(send ? "dst" : "src") + ": invalid peer " + std::to_string(peer) +
                          " for rank " + std::to_string(getRank()) + " of a group of " + std::to_string(getSize()));
  // Python's held operations (handed over) were issued first: they go first.
  if (p2p_handed_over_) flush_held_p2p();
  if (on_device) return cuda_p2p(send, t[0], peer);  // the stream engine's (device_p2p.cc)
  seq_.fetch_add(1);
  const c10d::OpType type = send ? c10d::OpType::SEND : c10d::OpType::RECV;
  if (t[0].nbytes() == 0)  // nothing to move (nor does the peer): complete at once
    return track(c10::make_intrusive<CommlibWork>(api_, type, kind, getRank(), t, nullptr, nullptr));
  // A non-contiguous tensor moves through a contiguous copy: a send's is taken now (what was in
  // the tensor when send was called goes out), a receive's is copied back once it arrived. (gloo
  // refuses them; the Python backend took them before #44, and so does this one.)
  at::Tensor c = dense(t[0]);
  std::function<void()> finish;  // (keeps the copy alive until the message moved)
  if (!c.is_same(t[0])) finish = [user = t[0], c, send]() mutable {
    if (!send) user.copy_(c);
  };
  std::weak_ptr<P2PHold> weak = hold_;
  auto work = c10::make_intrusive<CommlibWork>(api_, type, kind, getRank(), t, nullptr, std::move(finish), [weak] {
    if (auto hold = weak.lock()) hold->flush();
  });
  hold_->hold(send, c, peer, work);
  return track(work);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::send(std::vector<at::Tensor>& t, int dst, int) {
  return p2p(true, t, dst);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::recv(std::vector<at::Tensor>& t, int src, int) {
  return p2p(false, t, src);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::recvAnysource(std::vector<at::Tensor>& t, int tag) {
  if (t.size() == 1) refuse_sparse(t, "recv from any source");
  if (!host_tensor(t)) {  // (the Python side refuses device tensors, naming src)
    p2p_handed_over_ = true;
    return delegate("recv_anysource", t, tag);
  }
  if (getSize() < 2) throw py::value_error("src: receiving from any source needs another rank in the group");
  if (p2p_handed_over_) flush_held_p2p();
  hold_->flush();  // after every message held before it
  seq_.fetch_add(1);
  auto source = std::make_shared<int32_t>(-1);
  std::shared_ptr<commlib::Work> core_work;
  CoreError err;
  at::Tensor c = dense(t[0]);
  std::function<void()> finish = [user = t[0], c]() mutable {
    if (!c.is_same(user)) user.copy_(c);
  };
  if (!api_->recv_any(core_, reinterpret_cast<uintptr_t>(c.data_ptr()), static_cast<int64_t>(c.nbytes()),
                      DType::UInt8, source.get(), true, 0.0, &core_work, &err))
    raise_core_error(err, "recv", getRank());
  auto work = c10::make_intrusive<CommlibWork>(api_, c10d::OpType::RECVANYSOURCE, "recv", getRank(), t,
                                               std::move(core_work), std::move(finish));
  work->set_source(std::move(source));
  completer_.put(work);
  return track(work);
}

void CommlibBackend::startCoalescing() {
  // A block still open is one whose body raised (e.g. batch_isend_irecv of a sparse tensor, which
  // torch's dispatcher refuses): torch's _coalescing_manager calls endCoalescing only after its body
  // returned. As on gloo and NCCL the next block starts afresh; what the abandoned one held goes out
  // with the next issue, as any held message does. (Refusing here broke every later block.)
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::endCoalescing() {
  if (!coalescing_) throw py::value_error("endCoalescing: no coalescing block is open on this group");
  coalescing_ = false;
  hold_->flush();  // the block's sends and receives, as one set of batches
  if (p2p_handed_over_) flush_held_p2p();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.swap(coalesced_);
  return c10::make_intrusive<CoalescedWork>(getRank(), std::move(works));
}

}  // namespace torch_backend
}  // namespace commlib
