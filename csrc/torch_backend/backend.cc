// CommlibBackend (torch_backend/backend.h): which calls run on the core here, and the hand-over
// of the others to the Python backend.
#include "torch_backend/backend.h"

#include <utility>

#include "common/shapes.h"
#include "torch_backend/python_work.h"
#include "torch_backend/tensor_for_core.h"

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
      // (on integers too: the core pre-scales the input as it does for the Python backend's call)
      auto* sup = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      if (sup == nullptr) return false;
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

bool host_layout(const at::Tensor& t) {
  // Any strided layout, an expanded view (elements that overlap) included: every caller reads and
  // writes a non-contiguous tensor through a contiguous copy (dense/CopyBack, the staging layer), as
  // the Python backend does. An overlapping output's copy back is torch's own RuntimeError ("more
  // than one element of the written-to tensor refers to a single memory location"), raised after the
  // call ran, as on the Python backend (session 27: these were handed to it).
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && !t.is_conj() && !t.is_neg();
}

bool reduction_dtype(const at::Tensor& t, DType* dt) { return core_dtype(t.scalar_type(), dt); }

bool reduction_op(const c10d::ReduceOp& op, DType dt, RedOp* out, double* scale) { return core_op(op, dt, out, scale); }

CollectiveCall make_call(Collective c, uint8_t algo, DType dt, int64_t count, uintptr_t in, uintptr_t out,
                         int root) {
  return collective_call_on(c, algo, in, out, count, dt, RedOp::Sum, root);
}

CommlibBackend::CommlibBackend(const CoreApi* api, py::object group, uintptr_t core, int rank, int size,
                               std::array<uint8_t, kCollectives> algos, py::object factory)
    : c10d::Backend(rank, size),
      api_(api),
      group_(std::move(group)),
      factory_(std::move(factory)),
      core_(reinterpret_cast<void*>(core)),
      algos_(algos),
      hold_(std::make_shared<P2PHold>(api, core_, &completer_, [this](const std::vector<P2PHold::Held*>& round,
                                                                       CoreError* err) {
        return issue_device_round(round, err);
      })) {
  // The device call cache's address now (commlib.torch.native.wrap made the communicator's device
  // route before this backend): a first device call then reads nothing of the Python group.
  if (py::hasattr(group_, "_comm") && py::hasattr(group_.attr("_comm"), "_device_calls")) devices_.cache(group_);
}

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
  if (CommlibWork* spare = spare_.exchange(nullptr)) c10::intrusive_ptr<CommlibWork>::reclaim(spare);
  hold_->close();  // messages still held go out, and the completion thread drains them
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
                                                   const char* name, const std::vector<at::Tensor>& outputs,
                                                   std::function<void()> finish, std::chrono::milliseconds timeout) {
  const double secs = timeout_seconds(timeout);
  return submit(
      [&](bool a, std::shared_ptr<commlib::Work>* w, CoreError* err) {
        return api_->collective(core_, call, a, secs, a ? w : nullptr, err);
      },
      async, type, name, outputs, std::move(finish));
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::run_items(const std::vector<P2PItem>& items, DType dt,
                                                         int64_t a2av_count, bool async, c10d::OpType type,
                                                         const char* name, const std::vector<at::Tensor>& outputs,
                                                         std::function<void()> finish,
                                                         std::chrono::milliseconds timeout) {
  const double secs = timeout_seconds(timeout);
  return submit(
      [&](bool a, std::shared_ptr<commlib::Work>* w, CoreError* err) {
        return a2av_count < 0
                   ? api_->p2p(core_, items.data(), items.size(), dt, a, secs, a ? w : nullptr, err)
                   : api_->all_to_allv(core_, items.data(), items.size(), dt, a2av_count, a, secs, a ? w : nullptr, err);
      },
      async, type, name, outputs, std::move(finish));
}

int64_t element_bytes(DType dt) {
  switch (dt) {
    case DType::Float64: case DType::Int64: return 8;
    case DType::Float32: case DType::Int32: return 4;
    case DType::Float16: case DType::BFloat16: return 2;
    default: return 1;
  }
}

DType a_to_a_dtype(const at::Tensor& t) {
  DType dt;
  return core_dtype(t.scalar_type(), &dt) ? dt : DType::UInt8;
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::done_work(c10d::OpType type, const char* name,
                                                         const std::vector<at::Tensor>& outputs) {
  using Ptr = c10::intrusive_ptr<CommlibWork>;
  Ptr work;
  if (CommlibWork* spare = spare_.exchange(nullptr, std::memory_order_acq_rel)) {
    Ptr held = Ptr::reclaim(spare);
    if (held.use_count() == 1) work = std::move(held);  // else it lives on with its holders
  }
  if (!work) {
    work = c10::make_intrusive<CommlibWork>(api_, type, name, getRank(), std::vector<at::Tensor>(), nullptr, nullptr);
    works_made_.fetch_add(1, std::memory_order_relaxed);
  }
  work->rearm_done(type, name, outputs);
  if (CommlibWork* old = spare_.exchange(Ptr(work).release(), std::memory_order_acq_rel)) Ptr::reclaim(old);
  return work;
}

void CommlibBackend::flush_held_p2p() {
  py::gil_scoped_acquire gil;
  if (py::bool_(group_.attr("_p2p"))) group_.attr("_flush_p2p")();
  p2p_handed_over_ = false;
}

}  // namespace torch_backend
}  // namespace commlib
