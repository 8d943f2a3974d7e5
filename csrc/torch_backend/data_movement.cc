// CommlibBackend's data-movement calls (broadcast, gathers, scatters, barrier), the calls always
// handed to the Python backend, and the group's life cycle. Inputs that are not contiguous are
// read through a contiguous copy; outputs are written through one and copied back (CopyBack).
#include <utility>

#include "torch_backend/argument_errors.h"
#include "torch_backend/backend.h"
#include "torch_backend/python_work.h"
#include "torch_backend/tensor_for_core.h"

namespace py = pybind11;

namespace commlib {
namespace torch_backend {
namespace {

// A tensor moved as it is (once contiguous): a CPU tensor (host_layout). Calls that only move
// data take any dtype: one the core knows as itself, any other as its bytes (moved_as).
bool movable(const at::Tensor& t, DType* dt, int64_t* count) {
  if (!host_layout(t)) return false;
  moved_as(t, dt, count);
  return true;
}

// Every tensor of `ts` movable, of `like`'s dtype and size.
bool all_like(const std::vector<at::Tensor>& ts, const at::Tensor& like) {
  DType dt;
  int64_t n;
  for (const auto& t : ts)
    if (!movable(t, &dt, &n) || t.scalar_type() != like.scalar_type() || t.numel() != like.numel()) return false;
  return true;
}

// Copies the blocks of `flat` into `outs` (the list forms of the gathers).
void unpack(const at::Tensor& flat, std::vector<at::Tensor>& outs) {
  int64_t off = 0;
  for (auto& t : outs) {
    const int64_t n = t.numel();
    t.copy_(flat.narrow(0, off, n).view(t.sizes()));
    off += n;
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> CommlibBackend::broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o) {
  if (auto w = cuda_broadcast(t, static_cast<int>(o.rootRank))) return w;
  if (t.size() > 1)
    if (auto w = several_broadcast(t, o)) return w;
  if (t.size() == 1) {
    auto build = [&](const StageOn& on, StagedCall* s) {
      return stage_broadcast(on, t[0], static_cast<int>(o.rootRank), getRank(), getSize(), algo(Collective::Broadcast),
                             s);
    };
    if (t[0].defined() && t[0].is_cuda())
      if (auto w = cuda_staged(t[0], false, c10d::OpType::BROADCAST, "broadcast", t, build)) return w;
    StagedCall s;
    if (t[0].defined() && t[0].device().is_cpu() && build(StageOn(), &s))
      return run_staged(std::move(s), o.asyncOp, c10d::OpType::BROADCAST, "broadcast", t, o.timeout);
  }
  if (t.size() == 1) refuse_root(o.rootRank, getSize());  // (argument_errors.h: before any hand-over)
  return delegate("broadcast", t, o);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::_allgather_base(at::Tensor& out, at::Tensor& in,
                                                               const c10d::AllgatherOptions& o) {
  if (auto w = cuda_allgather_base(out, in)) return w;
  auto build = [&](const StageOn& on, StagedCall* s) {
    return stage_allgather_base(on, out, in, getSize(), algo(Collective::AllGather), s);
  };
  if (in.defined() && in.is_cuda())
    if (auto w = cuda_staged(in, true, c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {out}, build)) return w;
  StagedCall s;
  if (in.defined() && in.device().is_cpu() && build(StageOn(), &s))
    return run_staged(std::move(s), o.asyncOp, c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {out},
                      o.timeout);
  refuse_allgather_base(out, in, getSize());
  return delegate("_allgather_base", out, in, o);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::allgather(std::vector<std::vector<at::Tensor>>& out,
                                                         std::vector<at::Tensor>& in, const c10d::AllgatherOptions& o) {
  if (in.size() == 1 && out.size() == 1) {  // (CPU tensors' uneven blocks: uneven_allgather, below)
    auto build = [&](const StageOn& on, StagedCall* s) {
      return stage_allgather_list(on, out[0], in[0], getSize(), algo(Collective::AllGather), s);
    };
    if (in[0].defined() && in[0].is_cuda()) {
      if (auto w = cuda_staged(in[0], true, c10d::OpType::ALLGATHER, "all_gather", out[0], build)) return w;
      auto uneven = [&](const StageOn& on, StagedCall* s) {  // (declines an equal list: tried above)
        return stage_allgather_uneven(on, out[0], in[0], getSize(), getRank(), algo(Collective::AllGather), s);
      };
      if (auto w = cuda_staged(in[0], true, c10d::OpType::ALLGATHER, "all_gather", out[0], uneven)) return w;
    }
    StagedCall s;
    if (in[0].defined() && in[0].device().is_cpu() && build(StageOn(), &s))
      return run_staged(std::move(s), o.asyncOp, c10d::OpType::ALLGATHER, "all_gather", out[0], o.timeout);
  }
  if (auto w = in.size() > 1 ? several_allgather(out, in, o)
                             : in.size() == 1 && out.size() == 1 ? uneven_allgather(out[0], in[0], o) : nullptr)
    return w;
  refuse_allgather_list(out, in, getSize(), getRank());
  return delegate("allgather", out, in, o);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::gather(std::vector<std::vector<at::Tensor>>& out,
                                                      std::vector<at::Tensor>& in, const c10d::GatherOptions& o) {
  if (auto w = cuda_gather(out, in, static_cast<int>(o.rootRank))) return w;
  DType dt;
  int64_t n;
  const bool root = o.rootRank == getRank();
  if (in.size() == 1 && movable(in[0], &dt, &n) && o.rootRank >= 0 && o.rootRank < getSize() &&
      (!root || (out.size() == 1 && out[0].size() == static_cast<size_t>(getSize()) && all_like(out[0], in[0])))) {
    // (a non-root's list, which torch never passes, is ignored, as the Python backend ignores it)
    at::Tensor ci = dense(in[0]);
    at::Tensor flat = root ? at::empty({in[0].numel() * getSize()}, in[0].options()) : at::Tensor();
    auto call = make_call(Collective::Gather, algo(Collective::Gather), dt, n, address(ci),
                          root ? address(flat) : 0, static_cast<int>(o.rootRank));
    std::vector<at::Tensor> outs = root ? out[0] : std::vector<at::Tensor>();
    std::function<void()> finish = [ci] {};
    if (root) finish = [ci, flat, outs]() mutable { unpack(flat, outs); };
    return run(call, o.asyncOp, c10d::OpType::GATHER, "gather", outs, std::move(finish), o.timeout);
  }
  refuse_rooted(true, in, out, o.rootRank, getSize(), getRank());
  return delegate("gather", out, in, o);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::scatter(std::vector<at::Tensor>& out,
                                                       std::vector<std::vector<at::Tensor>>& in,
                                                       const c10d::ScatterOptions& o) {
  if (auto w = cuda_scatter(out, in, static_cast<int>(o.rootRank))) return w;
  DType dt;
  int64_t n;
  const bool root = o.rootRank == getRank();
  if (out.size() == 1 && movable(out[0], &dt, &n) && o.rootRank >= 0 && o.rootRank < getSize() &&
      (!root || (in.size() == 1 && in[0].size() == static_cast<size_t>(getSize()) && all_like(in[0], out[0])))) {
    // (a non-root's list, which torch never passes, is ignored, as the Python backend ignores it)
    at::Tensor flat;
    if (root) {
      std::vector<at::Tensor> blocks;
      for (const auto& t : in[0]) blocks.push_back(t.reshape({-1}));
      flat = at::cat(blocks);
    }
    at::Tensor co = dense(out[0]);
    CopyBack back;
    back.add(out[0], co);
    auto call = make_call(Collective::Scatter, algo(Collective::Scatter), dt, n, root ? address(flat) : 0,
                          address(co), static_cast<int>(o.rootRank));
    return run(call, o.asyncOp, c10d::OpType::SCATTER, "scatter", out, [flat, back]() mutable { back(); },
               o.timeout);
  }
  refuse_rooted(false, out, in, o.rootRank, getSize(), getRank());
  return delegate("scatter", out, in, o);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::barrier(const c10d::BarrierOptions& o) {
  auto call = make_call(Collective::Barrier, 0, DType::UInt8, 0, 0, 0, 0);
  return run(call, o.asyncOp, c10d::OpType::BARRIER, "barrier", {}, nullptr, o.timeout);
}

// -- life cycle ----------------------------------------------------------------------------------
c10::intrusive_ptr<c10d::Backend> CommlibBackend::shrink(const std::vector<int64_t>& ranks_to_exclude,
                                                         int shrink_flags, const c10::intrusive_ptr<Options>&) {
  // (SHRINK_ABORT: the Python side aborts the communicator, which fails our queued works too.)
  py::gil_scoped_acquire gil;
  py::object shrunk = group_.attr("shrink")(ranks_to_exclude, shrink_flags);
  return factory_(shrunk).cast<c10::intrusive_ptr<c10d::Backend>>();
}

void CommlibBackend::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  py::gil_scoped_acquire gil;
  group_.attr("setGroupName")(pg_uid);
}

void CommlibBackend::shutdown() {
  if (stopped_) return;
  stopped_ = true;
  hold_->close();
  stop_completer();  // drains: every queued call completes first
  py::gil_scoped_acquire gil;
  group_.attr("shutdown")();
  devices_.clear();  // the engines are closed: the device calls' tensors may go (after abort() they stay)
}

void CommlibBackend::abort() {
  if (stopped_) return;
  stopped_ = true;
  api_->abort(core_, "process group aborted");
  hold_->close();  // (what was held fails at once on the aborted communicator)
  stop_completer();
  py::gil_scoped_acquire gil;
  group_.attr("abort")();
}

}  // namespace torch_backend
}  // namespace commlib
