// CommlibBackend (torch_backend/backend.h): which calls run on the core here, and the hand-over
// of the others to the Python backend.
#include "torch_backend/backend.h"

#include <utility>

#include "common/shapes.h"
#include "torch_backend/python_work.h"

namespace py = pybind11;

namespace commlib {
namespace torch_backend {
namespace {

// The dtypes the core moves and reduces as they are (others go to the Python side, which moves
// them as bytes or reduces them in a wider type).
bool core_dtype(at::ScalarType s, DType* out) {
  switch (s) {
    case at::kFloat: *out = DType::Float32; return true;
    case at::kDouble: *out = DType::Float64; return true;
    case at::kHalf: *out = DType::Float16; return true;
    case at::kBFloat16: *out = DType::BFloat16; return true;
    case at::kChar: *out = DType::Int8; return true;
    case at::kByte: *out = DType::UInt8; return true;
    case at::kInt: *out = DType::Int32; return true;
    case at::kLong: *out = DType::Int64; return true;
    default: return false;
  }
}

// A tensor the core can take as it is: on the CPU, dense, contiguous, of a dtype it knows.
bool plain(const at::Tensor& t, DType* dt) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && !t.is_conj() &&
         !t.is_neg() && core_dtype(t.scalar_type(), dt);
}

bool plain(const at::Tensor& t) {
  DType dt;
  return plain(t, &dt);
}

bool all_plain_like(const std::vector<at::Tensor>& ts, const at::Tensor& like) {
  for (const auto& t : ts)
    if (!plain(t) || t.scalar_type() != like.scalar_type() || t.numel() != like.numel()) return false;
  return true;
}

uintptr_t address(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); }

// torch's ReduceOp as the core's, with premul_sum's factor; false where the Python side must
// decide (a factor on another device, bitwise ops on floats: it explains).
bool core_op(const c10d::ReduceOp& op, DType dt, RedOp* out, double* scale) {
  const bool integer = dt != DType::Float32 && dt != DType::Float64 && dt != DType::Float16 && dt != DType::BFloat16;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: *out = RedOp::Sum; return true;
    case c10d::ReduceOp::AVG: *out = RedOp::Avg; return true;
    case c10d::ReduceOp::PRODUCT: *out = RedOp::Prod; return true;
    case c10d::ReduceOp::MIN: *out = RedOp::Min; return true;
    case c10d::ReduceOp::MAX: *out = RedOp::Max; return true;
    case c10d::ReduceOp::BAND: *out = RedOp::BAnd; return integer;
    case c10d::ReduceOp::BOR: *out = RedOp::BOr; return integer;
    case c10d::ReduceOp::BXOR: *out = RedOp::BXor; return integer;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      if (sup == nullptr || integer) return false;
      if (sup->tensor_factor.defined()) {
        if (!sup->tensor_factor.device().is_cpu()) return false;
        *scale = sup->tensor_factor.item<double>();
      } else {
        *scale = sup->double_factor;
      }
      *out = RedOp::PremulSum;
      return true;
    }
    default: return false;
  }
}


}  // namespace

CollectiveCall make_call(Collective c, uint8_t algo, DType dt, int64_t count, uintptr_t in, uintptr_t out,
                         int root) {
  CollectiveCall call;
  call.coll = c;
  call.algo = algo;
  call.dtype = dt;
  call.count = count;
  call.input = in;
  call.output = out;
  call.root = root;
  return call;
}

CommlibBackend::CommlibBackend(const CoreApi* api, py::object group, uintptr_t core, int rank, int size,
                               std::array<uint8_t, kCollectives> algos, py::object factory)
    : c10d::Backend(rank, size),
      api_(api),
      group_(std::move(group)),
      factory_(std::move(factory)),
      core_(reinterpret_cast<void*>(core)),
      algos_(algos) {}

void CommlibBackend::stop_completer() {
  // Without the GIL: a future's callback on the completion thread may need it.
  if (Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release nogil;
    completer_.stop();
  } else {
    completer_.stop();
  }
}

CommlibBackend::~CommlibBackend() {
  stop_completer();
  if (Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    group_ = py::object();
    factory_ = py::object();
  } else {  // the interpreter is gone: nothing may touch the references any more
    group_.release();
    factory_.release();
  }
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::run(const CollectiveCall& call, bool async, c10d::OpType type,
                                                   const char* name, std::vector<at::Tensor> outputs,
                                                   std::function<void()> finish) {
  if (p2p_handed_over_) flush_held_p2p();
  seq_.fetch_add(1);
  // A future's callback running on the completion thread that issues a call (PowerSGD's hook
  // waits on an all_reduce inside .then) runs it here, or it would wait on its own thread.
  if (async && completer_.on_thread()) async = false;
  std::shared_ptr<commlib::Work> core_work;
  CoreError err;
  bool ok;
  // torch's bindings released the GIL before the dispatcher called us: none is held here.
  ok = api_->collective(core_, call, async, async ? &core_work : nullptr, &err);
  if (!ok) raise_core_error(err, name, getRank());
  if (!async && finish) finish();
  auto work = c10::make_intrusive<CommlibWork>(api_, type, name, getRank(), std::move(outputs), core_work,
                                              async ? std::move(finish) : nullptr);
  if (async) completer_.put(work);
  return work;
}

void CommlibBackend::flush_held_p2p() {
  py::gil_scoped_acquire gil;
  if (py::bool_(group_.attr("_p2p"))) group_.attr("_flush_p2p")();
  p2p_handed_over_ = false;
}

// -- reductions ------------------------------------------------------------------------------
c10::intrusive_ptr<c10d::Work> CommlibBackend::allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) {
  DType dt;
  CollectiveCall call;
  if (t.size() == 1 && plain(t[0], &dt) && core_op(o.reduceOp, dt, &call.op, &call.scale)) {
    const RedOp op = call.op;
    const double scale = call.scale;
    call = make_call(Collective::AllReduce, algo(Collective::AllReduce), dt, t[0].numel(), address(t[0]),
                     address(t[0]));
    call.op = op;
    call.scale = scale;
    return run(call, o.asyncOp, c10d::OpType::ALLREDUCE, "all_reduce", t);
  }
  return delegate("allreduce", t, o);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) {
  DType dt;
  RedOp op;
  double scale = 1.0;
  if (t.size() == 1 && plain(t[0], &dt) && core_op(o.reduceOp, dt, &op, &scale)) {
    auto call = make_call(Collective::Reduce, algo(Collective::Reduce), dt, t[0].numel(), address(t[0]),
                          address(t[0]), static_cast<int>(o.rootRank));
    call.op = op;
    call.scale = scale;
    return run(call, o.asyncOp, c10d::OpType::REDUCE, "reduce", t);
  }
  return delegate("reduce", t, o);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::_reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                                    const c10d::ReduceScatterOptions& o) {
  DType dt, dt_in;
  RedOp op;
  double scale = 1.0;
  if (plain(out, &dt) && plain(in, &dt_in) && dt == dt_in && in.numel() == out.numel() * getSize() &&
      core_op(o.reduceOp, dt, &op, &scale)) {
    auto call = make_call(Collective::ReduceScatter, algo(Collective::ReduceScatter), dt, out.numel(), address(in),
                          address(out));
    call.op = op;
    call.scale = scale;
    return run(call, o.asyncOp, c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {out});
  }
  return delegate("_reduce_scatter_base", out, in, o);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::reduce_scatter(std::vector<at::Tensor>& out,
                                                              std::vector<std::vector<at::Tensor>>& in,
                                                              const c10d::ReduceScatterOptions& o) {
  DType dt;
  RedOp op;
  double scale = 1.0;
  if (out.size() == 1 && in.size() == 1 && plain(out[0], &dt) && in[0].size() == static_cast<size_t>(getSize()) &&
      all_plain_like(in[0], out[0]) && core_op(o.reduceOp, dt, &op, &scale)) {
    at::Tensor flat = at::cat(in[0]);  // the blocks side by side, as the core reads them
    auto call = make_call(Collective::ReduceScatter, algo(Collective::ReduceScatter), dt, out[0].numel(),
                          address(flat), address(out[0]));
    call.op = op;
    call.scale = scale;
    return run(call, o.asyncOp, c10d::OpType::REDUCE_SCATTER, "reduce_scatter", out, [flat] {});
  }
  return delegate("reduce_scatter", out, in, o);
}

}  // namespace torch_backend
}  // namespace commlib
