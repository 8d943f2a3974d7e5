// CommlibBackend's reductions on CPU tensors: all_reduce, reduce, reduce_scatter (list and
// tensor). A tensor of a dtype the core reduces, contiguous, runs on its own memory (all_reduce's
// latency path first, unchanged); any other dtype torch reduces, a conjugate or negative view, or a
// non-contiguous tensor through a staging buffer (reduction_of: staging.py's reduction_staging in
// C++), the result copied back with a cast. A declined call's argument errors are raised here
// (argument_errors.h) before the hand-over; what is then handed over is no error.
#include <algorithm>
#include <string>
#include <utility>

#include "torch_backend/argument_errors.h"
#include "torch_backend/backend.h"
#include "torch_backend/tensor_for_core.h"

namespace py = pybind11;

namespace commlib {
namespace torch_backend {
namespace {

// A CPU tensor the core reduces on its own memory once contiguous, of a dtype it reduces as it is
// (the latency path's test).
bool reduced_as_it_lies(const at::Tensor& t, DType* dt) { return host_layout(t) && reduction_dtype(t, dt); }

// A strided tensor whose values a staging copy can read and write back (an expanded view's copy
// back raises torch's own error, as on the Python backend: backend.cc host_layout).
bool stageable(const at::Tensor& t) { return t.defined() && t.layout() == at::kStrided; }

// torch's op as the Python side names it in a message (argument_errors.h's op_name).
const char* named(c10d::ReduceOp::RedOpType op) {
  const char* name = op_name(op);
  return name ? name : "unsupported";
}

}  // namespace

bool reduction_of(const at::Tensor& t, const c10d::ReduceOp& op, Reduction* r) {
  return t.defined() && t.device().is_cpu() && reduction_in(t, op, r);
}

bool reduction_in(const at::Tensor& t, const c10d::ReduceOp& op, Reduction* r) {
  if (!stageable(t)) return false;
  const at::ScalarType s = t.scalar_type();
  c10d::ReduceOp core_op = op;  // (bool maps it; premul_sum keeps its factor)
  r->reals = 1;
  if (reduction_dtype(t, &r->dt)) {
    r->stage = s;
  } else if (s == at::kBool) {
    switch (op.op_) {
      case c10d::ReduceOp::SUM: case c10d::ReduceOp::MAX: case c10d::ReduceOp::BOR: case c10d::ReduceOp::AVG:
        core_op = c10d::ReduceOp(c10d::ReduceOp::MAX); break;
      case c10d::ReduceOp::PRODUCT: case c10d::ReduceOp::MIN: case c10d::ReduceOp::BAND:
        core_op = c10d::ReduceOp(c10d::ReduceOp::MIN); break;
      case c10d::ReduceOp::BXOR: break;
      default: throw py::value_error(std::string("op: ") + named(op.op_) + " is not defined for torch.bool tensors");
    }
    r->stage = at::kByte;
    r->dt = DType::UInt8;
  } else if (at::isComplexType(s)) {
    if (op.op_ != c10d::ReduceOp::SUM && op.op_ != c10d::ReduceOp::AVG && op.op_ != c10d::ReduceOp::PREMUL_SUM)
      throw py::value_error(std::string("op: ") + named(op.op_) + " is not defined for complex tensors");
    r->stage = s;
    r->dt = s == at::kComplexDouble ? DType::Float64 : s == at::kComplexFloat ? DType::Float32 : DType::Float16;
    r->reals = 2;
  } else if (at::isIntegralType(s, /*includeBool=*/false)) {  // int16, uint16/32/64: in int64
    const bool averaged = op.op_ == c10d::ReduceOp::AVG || op.op_ == c10d::ReduceOp::PREMUL_SUM;
    r->stage = averaged ? at::kDouble : at::kLong;
    r->dt = averaged ? DType::Float64 : DType::Int64;
  } else if (at::isFloatingType(s)) {  // float8 and the like: in float32
    r->stage = at::kFloat;
    r->dt = DType::Float32;
  } else {
    return false;  // (quantized, bits, ...: the Python side explains)
  }
  r->scale = 1.0;
  return reduction_op(core_op, r->dt, &r->op, &r->scale);
}

at::Tensor staged_for(const at::Tensor& t, const Reduction& r) {
  if (t.scalar_type() == r.stage && t.is_contiguous() && !t.is_conj() && !t.is_neg()) return t;
  at::Tensor s = at::empty(t.sizes(), t.options().dtype(r.stage).memory_format(at::MemoryFormat::Contiguous));
  s.copy_(t);  // (casts, and resolves conjugate and negative views)
  return s;
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::run_staged(StagedCall s, bool async, c10d::OpType type,
                                                          const char* name, const std::vector<at::Tensor>& outputs,
                                                          std::chrono::milliseconds timeout) {
  std::function<void()> finish;  // (holds the staged buffers, and an asynchronous call's inputs, until the call ran)
  if (!s.nothing_staged() || (async && !s.inputs.empty()))
    finish = [keep = std::move(s.keep), inputs = async ? std::move(s.inputs) : std::vector<at::Tensor>(),
              after = std::move(s.after)]() mutable {
      if (after) after();
    };
  return run(s.call, async, type, name, outputs, std::move(finish), timeout);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::staged_reduction(Collective c, std::vector<at::Tensor>& t,
                                                                const c10d::ReduceOp& reduce_op, int root, bool async,
                                                                std::chrono::milliseconds timeout) {
  StagedCall s;
  if (t.size() != 1 || !stage_reduction(StageOn(), c, t[0], reduce_op, root, getRank(), getSize(), algo(c), &s))
    return nullptr;
  const bool all = c == Collective::AllReduce;
  return run_staged(std::move(s), async, all ? c10d::OpType::ALLREDUCE : c10d::OpType::REDUCE,
                    all ? "all_reduce" : "reduce", t, timeout);
}

// The staged CUDA reductions (device_staged.cc runs them), after the unstaged CUDA entry declined.
namespace {
bool one_tensor(const std::vector<at::Tensor>& t) { return t.size() == 1 && t[0].defined(); }
}  // namespace

c10::intrusive_ptr<c10d::Work> CommlibBackend::allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) {
  if (auto w = cuda_reduction(Collective::AllReduce, t, o.reduceOp, 0, c10d::OpType::ALLREDUCE, "all_reduce")) return w;
  if (one_tensor(t) && t[0].is_cuda())  // (no std::function made on a CPU call's path)
    if (auto w = cuda_staged(t[0], false, c10d::OpType::ALLREDUCE, "all_reduce", t, [&](const StageOn& on, StagedCall* s) {
          return stage_reduction(on, Collective::AllReduce, t[0], o.reduceOp, 0, getRank(), getSize(),
                                 algo(Collective::AllReduce), s);
        }))
      return w;
  DType dt;
  RedOp op;
  double scale = 1.0;
  if (t.size() == 1 && reduced_as_it_lies(t[0], &dt) && reduction_op(o.reduceOp, dt, &op, &scale)) {  // the latency path
    at::Tensor c = dense(t[0]);
    CopyBack back;
    back.add(t[0], c);
    auto call = make_call(Collective::AllReduce, algo(Collective::AllReduce), dt, c.numel(), address(c), address(c));
    call.op = op;
    call.scale = scale;
    return run(call, o.asyncOp, c10d::OpType::ALLREDUCE, "all_reduce", t, back.empty() ? nullptr : std::function<void()>(back),
               o.timeout);
  }
  if (t.size() == 1 && t[0].defined() && t[0].is_sparse()) return allreduce_sparse(t, o);
  if (auto w = t.size() == 1 ? staged_reduction(Collective::AllReduce, t, o.reduceOp, 0, o.asyncOp, o.timeout)
                             : several_allreduce(t, o))
    return w;
  if (t.size() == 1) refuse_reduction(t[0], o.reduceOp);  // (argument_errors.h: before any hand-over)
  return delegate("allreduce", t, o);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) {
  if (auto w = cuda_reduction(Collective::Reduce, t, o.reduceOp, static_cast<int>(o.rootRank), c10d::OpType::REDUCE,
                              "reduce"))
    return w;
  if (one_tensor(t) && t[0].is_cuda())  // (no std::function made on a CPU call's path)
    if (auto w = cuda_staged(t[0], false, c10d::OpType::REDUCE, "reduce", t, [&](const StageOn& on, StagedCall* s) {
          return stage_reduction(on, Collective::Reduce, t[0], o.reduceOp, static_cast<int>(o.rootRank), getRank(),
                                 getSize(), algo(Collective::Reduce), s);
        }))
      return w;
  if (t.size() > 1)  // (as gloo: one tensor per reduce)
    throw py::value_error("tensors: reduce takes one tensor per call, got " + std::to_string(t.size()));
  if (auto w = staged_reduction(Collective::Reduce, t, o.reduceOp, static_cast<int>(o.rootRank), o.asyncOp, o.timeout))
    return w;
  if (t.size() == 1) refuse_reduction(t[0], o.reduceOp, true, o.rootRank, getSize());
  return delegate("reduce", t, o);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::_reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                                    const c10d::ReduceScatterOptions& o) {
  if (auto w = cuda_reduce_scatter_base(out, in, o.reduceOp)) return w;
  auto build = [&](const StageOn& on, StagedCall* s) {
    return stage_reduce_scatter_base(on, out, in, o.reduceOp, getSize(), algo(Collective::ReduceScatter), s);
  };
  if (out.defined() && out.is_cuda())
    if (auto w = cuda_staged(out, true, c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {out}, build))
      return w;
  StagedCall s;
  if (out.defined() && out.device().is_cpu() && build(StageOn(), &s))
    return run_staged(std::move(s), o.asyncOp, c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {out},
                      o.timeout);
  refuse_reduce_scatter_base(out, in, o.reduceOp, getSize());
  return delegate("_reduce_scatter_base", out, in, o);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::reduce_scatter(std::vector<at::Tensor>& out,
                                                              std::vector<std::vector<at::Tensor>>& in,
                                                              const c10d::ReduceScatterOptions& o) {
  // The input list's blocks side by side, each padded to the largest when they differ (the padding
  // is reduced and thrown away), in the staging dtype; the output through a buffer of that dtype.
  refuse_reduce_scatter_lists(out, in);  // (as gloo: one output per reduce_scatter; one input list for it)
  auto build = [&](const StageOn& on, StagedCall* s) {
    return stage_reduce_scatter_list(on, out[0], in[0], o.reduceOp, getSize(), getRank(),
                                     algo(Collective::ReduceScatter), s);
  };
  if (out[0].defined() && out[0].is_cuda())
    if (auto w = cuda_staged(out[0], true, c10d::OpType::REDUCE_SCATTER, "reduce_scatter", out, build)) return w;
  StagedCall s;
  if (!out[0].defined() || !out[0].device().is_cpu() || !build(StageOn(), &s)) {
    refuse_reduce_scatter_list(out[0], in[0], o.reduceOp, getSize(), getRank());
    return delegate("reduce_scatter", out, in, o);
  }
  return run_staged(std::move(s), o.asyncOp, c10d::OpType::REDUCE_SCATTER, "reduce_scatter", out, o.timeout);
}

}  // namespace torch_backend
}  // namespace commlib
