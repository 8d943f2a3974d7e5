// The staging layer's builders (staging.h): device-generic, ATen's stream-ordered ops only.
#include "torch_backend/staging.h"

#include <algorithm>
#include <utility>

#include "torch_backend/backend.h"
#include "torch_backend/tensor_for_core.h"

namespace commlib {
namespace torch_backend {
namespace {

bool as_it_lies(const at::Tensor& t, at::ScalarType s) {
  return t.scalar_type() == s && t.is_contiguous() && !t.is_conj() && !t.is_neg();
}

// `t`'s values as a contiguous tensor of dtype `s` (cast, conjugate and negative views resolved by
// copy_): `t` itself when it is one already, else a buffer kept by the call.
at::Tensor staged_in(const StageOn& on, const at::Tensor& t, at::ScalarType s, StagedCall* call) {
  if (as_it_lies(t, s)) {
    call->inputs.push_back(t);
    return t;
  }
  at::Tensor b = on.empty(t.sizes(), t.options().dtype(s));
  b.copy_(t);
  call->keep.push_back(b);
  return b;
}

// Where an output `t` is written: `t` itself when the core can write it as it lies, else a buffer
// of dtype `s` kept by the call (its values copied into `t` after it).
at::Tensor staged_out(const StageOn& on, const at::Tensor& t, at::ScalarType s, StagedCall* call) {
  if (as_it_lies(t, s)) return t;
  at::Tensor b = on.empty(t.sizes(), t.options().dtype(s));
  call->keep.push_back(b);
  return b;
}

void set_op(CollectiveCall* call, const Reduction& r) {
  call->op = r.op;
  call->scale = r.scale;
}

}  // namespace

at::Tensor StageOn::empty(at::IntArrayRef sizes, const at::TensorOptions& options) const {
  const at::TensorOptions o = options.memory_format(at::MemoryFormat::Contiguous);
  return alloc ? alloc(sizes, o) : at::empty(sizes, o);
}

bool StageOn::holds(const at::Tensor& t) const {
  if (!t.defined() || t.layout() != at::kStrided || t.device().type() != device.type()) return false;
  // (any strided layout, an expanded view included: read through a copy; an overlapping output's
  // copy back is torch's own error, as on the Python backend: backend.cc host_layout)
  return device.is_cpu() || t.device() == device;
}

bool stage_reduction(const StageOn& on, Collective c, const at::Tensor& t, const c10d::ReduceOp& op, int root, int me,
                     int P, uint8_t algo, StagedCall* s) {
  const bool all = c == Collective::AllReduce;
  Reduction r;
  if ((!all && (root < 0 || root >= P)) || !on.holds(t) || !reduction_in(t, op, &r)) return false;
  at::Tensor x = staged_in(on, t, r.stage, s);
  s->call = make_call(c, algo, r.dt, x.numel() * r.reals, address(x), address(x), all ? 0 : root);
  set_op(&s->call, r);
  if (!x.is_same(t) && (all || root == me)) {  // (a reduce's result is the root's alone)
    at::Tensor user = t;
    s->after = [user, x]() mutable { user.copy_(x); };
  }
  return true;
}

bool stage_reduce_scatter_base(const StageOn& on, const at::Tensor& out, const at::Tensor& in,
                               const c10d::ReduceOp& op, int P, uint8_t algo, StagedCall* s) {
  Reduction r;
  if (!on.holds(out) || !on.holds(in) || in.scalar_type() != out.scalar_type() || in.numel() != out.numel() * P ||
      !reduction_in(out, op, &r))
    return false;
  at::Tensor si = staged_in(on, in, r.stage, s), so = staged_out(on, out, r.stage, s);
  s->call = make_call(Collective::ReduceScatter, algo, r.dt, so.numel() * r.reals, address(si), address(so));
  set_op(&s->call, r);
  if (!so.is_same(out)) {
    at::Tensor user = out;
    s->after = [user, so]() mutable { user.copy_(so); };
  }
  return true;
}

bool stage_reduce_scatter_list(const StageOn& on, const at::Tensor& out, const std::vector<at::Tensor>& in,
                               const c10d::ReduceOp& op, int P, int me, uint8_t algo, StagedCall* s) {
  Reduction r;
  if (in.size() != static_cast<size_t>(P) || !on.holds(out) || in[me].numel() != out.numel() ||
      !reduction_in(out, op, &r))
    return false;
  int64_t m = 0;
  bool equal = true;
  at::ScalarType promoted = in[0].defined() ? in[0].scalar_type() : out.scalar_type();  // (undefined: declined below)
  for (const auto& x : in) {
    if (!on.holds(x)) return false;
    equal = equal && x.numel() == in[0].numel();
    m = std::max<int64_t>(m, x.numel());
    promoted = at::promoteTypes(promoted, x.scalar_type());
  }
  // Inputs of other dtypes than the output's, as the Python side takes them (data_movement.py
  // reduce_scatter): equal blocks are concatenated, so their promoted dtype must be the output's
  // (else the TypeError argument_errors.h raises); uneven ones are cast into the output's dtype. Each
  // is cast to the output's dtype first, then to the staging dtype, so the values reduced are those
  // the Python side reduces (an int32 block into an int16 output wraps before it widens).
  if (equal && promoted != out.scalar_type()) return false;
  // The blocks side by side, each padded to the largest when they differ, in the staging dtype.
  at::Tensor flat = on.empty({m * P}, out.options().dtype(r.stage));
  if (!equal) flat.zero_();
  for (int j = 0; j < P; ++j) {
    const at::Tensor x = in[j].scalar_type() == out.scalar_type() ? in[j] : in[j].to(out.scalar_type());
    flat.narrow(0, j * m, in[j].numel()).copy_(x.reshape({-1}));
  }
  s->keep.push_back(flat);
  at::Tensor so = equal ? staged_out(on, out, r.stage, s) : on.empty({m}, flat.options());
  if (!equal) s->keep.push_back(so);
  s->call = make_call(Collective::ReduceScatter, algo, r.dt, m * r.reals, address(flat), address(so));
  set_op(&s->call, r);
  if (!so.is_same(out)) {
    at::Tensor user = out;
    s->after = [user, so]() mutable { user.copy_(so.reshape({-1}).narrow(0, 0, user.numel()).view(user.sizes())); };
  }
  return true;
}

bool stage_broadcast(const StageOn& on, const at::Tensor& t, int root, int me, int P, uint8_t algo, StagedCall* s) {
  if (root < 0 || root >= P || !on.holds(t)) return false;
  // The root sends its values (resolved); another rank receives into a buffer copied back after.
  at::Tensor x = me == root ? staged_in(on, t, t.scalar_type(), s) : staged_out(on, t, t.scalar_type(), s);
  DType dt;
  int64_t n;
  moved_as(x, &dt, &n);
  s->call = make_call(Collective::Broadcast, algo, dt, n, address(x), address(x), root);
  if (me != root && !x.is_same(t)) {
    at::Tensor user = t;
    s->after = [user, x]() mutable { user.copy_(x); };
  }
  return true;
}

bool stage_allgather_base(const StageOn& on, const at::Tensor& out, const at::Tensor& in, int P, uint8_t algo,
                          StagedCall* s) {
  if (!on.holds(in) || !on.holds(out) || in.scalar_type() != out.scalar_type() || out.numel() != in.numel() * P)
    return false;
  at::Tensor ci = staged_in(on, in, in.scalar_type(), s), co = staged_out(on, out, out.scalar_type(), s);
  DType dt;
  int64_t n;
  moved_as(ci, &dt, &n);
  s->call = make_call(Collective::AllGather, algo, dt, n, address(ci), address(co));
  if (!co.is_same(out)) {
    at::Tensor user = out;
    s->after = [user, co]() mutable { user.copy_(co.view(user.sizes())); };
  }
  return true;
}

bool stage_allgather_list(const StageOn& on, const std::vector<at::Tensor>& outs, const at::Tensor& in, int P,
                          uint8_t algo, StagedCall* s) {
  if (outs.size() != static_cast<size_t>(P) || !on.holds(in)) return false;
  for (const auto& t : outs)
    if (!on.holds(t) || t.scalar_type() != in.scalar_type() || t.numel() != in.numel()) return false;
  at::Tensor ci = staged_in(on, in, in.scalar_type(), s);
  at::Tensor flat = on.empty({in.numel() * P}, in.options());
  s->keep.push_back(flat);
  DType dt;
  int64_t n;
  moved_as(ci, &dt, &n);
  s->call = make_call(Collective::AllGather, algo, dt, n, address(ci), address(flat));
  const int64_t k = in.numel();
  std::vector<at::Tensor> users = outs;
  s->after = [users, flat, k]() mutable {
    for (size_t j = 0; j < users.size(); ++j)
      users[j].copy_(flat.narrow(0, static_cast<int64_t>(j) * k, k).view(users[j].sizes()));
  };
  return true;
}

bool stage_allgather_uneven(const StageOn& on, const std::vector<at::Tensor>& outs, const at::Tensor& in, int P,
                            int me, uint8_t algo, StagedCall* s) {
  if (outs.size() != static_cast<size_t>(P) || !on.holds(in) || outs[me].numel() != in.numel()) return false;
  int64_t m = 0;
  bool equal = true;
  for (const auto& t : outs) {
    if (!on.holds(t) || t.scalar_type() != in.scalar_type()) return false;
    equal = equal && t.numel() == in.numel();
    m = std::max<int64_t>(m, t.numel());
  }
  if (equal) return false;  // (stage_allgather_list's)
  // This rank's block padded to the largest (the padding is sent and thrown away: never read).
  at::Tensor padded = on.empty({m}, in.options());
  padded.narrow(0, 0, in.numel()).view(in.sizes()).copy_(in);
  at::Tensor flat = on.empty({m * P}, in.options());
  s->keep.push_back(padded);
  s->keep.push_back(flat);
  DType dt;
  int64_t n;
  moved_as(padded, &dt, &n);
  s->call = make_call(Collective::AllGather, algo, dt, n, address(padded), address(flat));
  std::vector<at::Tensor> users = outs;
  s->after = [users, flat, m]() mutable {
    for (size_t j = 0; j < users.size(); ++j)
      users[j].copy_(flat.narrow(0, static_cast<int64_t>(j) * m, users[j].numel()).view(users[j].sizes()));
  };
  return true;
}

bool stage_alltoall_base(const StageOn& on, const at::Tensor& out, const at::Tensor& in, int P, uint8_t algo,
                         StagedCall* s) {
  if (!on.holds(in) || !on.holds(out) || in.scalar_type() != out.scalar_type() || in.numel() != out.numel() ||
      in.numel() % P)
    return false;
  at::Tensor ci = staged_in(on, in, in.scalar_type(), s), co = staged_out(on, out, out.scalar_type(), s);
  if (ci.numel() && ci.data_ptr() == co.data_ptr()) {  // in place: the core's all_to_all sends from a copy
    ci = on.empty(in.sizes(), in.options());
    ci.copy_(in);
    s->keep.push_back(ci);
  }
  s->call = make_call(Collective::AllToAll, algo, DType::UInt8, static_cast<int64_t>(ci.nbytes()) / P, address(ci),
                      address(co));
  if (!co.is_same(out)) {
    at::Tensor user = out;
    s->after = [user, co]() mutable { user.copy_(co.view(user.sizes())); };
  }
  return true;
}

}  // namespace torch_backend
}  // namespace commlib
