// The argument errors the C++ backend raises itself (argument_errors.h): the Python backend's checks
// and messages, in its order (commlib/torch/backend.py, data_movement.py, staging.py; call_checks.py).
#include "torch_backend/argument_errors.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <tuple>

namespace py = pybind11;

namespace commlib {
namespace torch_backend {
namespace {

// As Python prints a dtype ("torch.float32"): torch's own dtype object's str (only ever on the way
// to raising).
std::string dtype_of(at::ScalarType s) {
  py::gil_scoped_acquire gil;
  return py::str(reinterpret_cast<PyObject*>(torch::getTHPDtype(s))).cast<std::string>();
}
std::string dtype_of(const at::Tensor& t) { return dtype_of(t.scalar_type()); }
std::string num(int64_t n) { return std::to_string(n); }

bool bitwise(c10d::ReduceOp::RedOpType op) {
  return op == c10d::ReduceOp::BAND || op == c10d::ReduceOp::BOR || op == c10d::ReduceOp::BXOR;
}

// The commlib dtype name of the float buffer reduction_staging reduces `s` in (a native float as
// itself, complex as its reals, any other float in float32); null for an integer or bool buffer.
const char* float_buffer(at::ScalarType s) {
  if (at::isComplexType(s)) s = c10::toRealValueType(s);
  switch (s) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    default: return at::isFloatingType(s) ? "float32" : nullptr;
  }
}

// devices.py's check_one_device: every tensor of a call on the first one's device, else a ValueError
// naming the odd one by its label (`name`, `name[i]`, `name[r][i]`) and the first.
class OneDevice {
 public:
  OneDevice& one(const std::string& label, const at::Tensor& t) {
    if (!t.defined()) return *this;
    if (first_.empty()) {
      first_ = label;
      device_ = t.device();
    } else if (t.device() != device_) {
      throw py::value_error(label + ": is on " + t.device().str() + " but " + first_ + " is on " + device_.str() +
                            "; the tensors of one call must all be on one device");
    }
    return *this;
  }
  OneDevice& list(const std::string& name, const std::vector<at::Tensor>& ts) {
    for (size_t i = 0; i < ts.size(); ++i) one(name + "[" + num(static_cast<int64_t>(i)) + "]", ts[i]);
    return *this;
  }
  OneDevice& lists(const std::string& name, const std::vector<std::vector<at::Tensor>>& ls) {
    for (size_t r = 0; r < ls.size(); ++r) list(name + "[" + num(static_cast<int64_t>(r)) + "]", ls[r]);
    return *this;
  }

 private:
  std::string first_;
  c10::Device device_{c10::kCPU};
};

}  // namespace

const char* op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "sum";
    case c10d::ReduceOp::AVG: return "avg";
    case c10d::ReduceOp::PRODUCT: return "prod";
    case c10d::ReduceOp::MIN: return "min";
    case c10d::ReduceOp::MAX: return "max";
    case c10d::ReduceOp::BAND: return "band";
    case c10d::ReduceOp::BOR: return "bor";
    case c10d::ReduceOp::BXOR: return "bxor";
    case c10d::ReduceOp::PREMUL_SUM: return "premul_sum";
    default: return nullptr;
  }
}

void refuse_root(int64_t root, int P) {
  if (root < 0 || root >= P)
    throw py::value_error("root: " + num(root) + " is out of range for a communicator of size " + num(P));
}

void refuse_reduction(const at::Tensor& t, const c10d::ReduceOp& op, bool rooted, int64_t root, int P) {
  if (!t.defined() || t.layout() != at::kStrided) return;
  const char* name = op_name(op.op_);
  if (name == nullptr) return;  // (op_of's message prints torch's object: left to the Python side)
  const at::ScalarType s = t.scalar_type();
  if (s == at::kBool && op.op_ == c10d::ReduceOp::PREMUL_SUM)
    throw py::value_error(std::string("op: ") + name + " is not defined for torch.bool tensors");
  if (at::isComplexType(s) && op.op_ != c10d::ReduceOp::SUM && op.op_ != c10d::ReduceOp::AVG &&
      op.op_ != c10d::ReduceOp::PREMUL_SUM)
    throw py::value_error(std::string("op: ") + name + " is not defined for complex tensors");
  if (rooted) refuse_root(root, P);
  const char* floats = float_buffer(s);
  if (bitwise(op.op_) && floats != nullptr)
    throw py::value_error(std::string("op: bitwise reduction '") + name +
                          "' is defined for integer dtypes only, not " + floats);
}

void refuse_reductions(const std::vector<at::Tensor>& t, const c10d::ReduceOp& op) {
  OneDevice().list("tensors", t);
  for (const auto& x : t) refuse_reduction(x, op);
}

void refuse_allgather_base(const at::Tensor& out, const at::Tensor& in, int P) {
  if (!out.defined() || !in.defined()) return;
  if (out.scalar_type() != in.scalar_type())
    throw py::type_error("output_tensor: dtype " + dtype_of(out) + " differs from input's " + dtype_of(in));
  if (out.numel() != in.numel() * P)
    throw py::value_error("output_tensor: has " + num(out.numel()) + " elements, expected world_size*input = " +
                          num(P) + "*" + num(in.numel()));
}

void refuse_reduce_scatter_base(const at::Tensor& out, const at::Tensor& in, const c10d::ReduceOp& op, int P) {
  if (!out.defined() || !in.defined() || op_name(op.op_) == nullptr) return;
  if (out.scalar_type() != in.scalar_type())
    throw py::type_error("output: dtype " + dtype_of(out) + " differs from input's " + dtype_of(in));
  if (in.numel() != out.numel() * P)
    throw py::value_error("input: has " + num(in.numel()) + " elements, expected world_size*output = " + num(P) +
                          "*" + num(out.numel()));
  refuse_reduction(out, op);
}

void refuse_reduce_scatter_lists(const std::vector<at::Tensor>& out, const std::vector<std::vector<at::Tensor>>& in) {
  if (out.size() != 1)
    throw py::value_error("output_tensors: reduce_scatter takes one output per call, got " +
                          num(static_cast<int64_t>(out.size())));
  if (in.size() != 1)
    throw py::value_error("input_tensors: has " + num(static_cast<int64_t>(in.size())) +
                          " lists, expected one per output (1)");
}

void refuse_pair_counts(const std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in) {
  if (out.size() != in.size())
    throw py::value_error("output_tensors: has " + num(static_cast<int64_t>(out.size())) +
                          " tensors, expected one per input (" + num(static_cast<int64_t>(in.size())) + ")");
}

void refuse_allgather_pairs(const std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in, int P) {
  refuse_pair_counts(out, in);
  for (size_t i = 0; i < out.size(); ++i) refuse_allgather_base(out[i], in[i], P);
}

void refuse_reduce_scatter_pairs(const std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in,
                                 const c10d::ReduceOp& op, int P) {
  refuse_pair_counts(out, in);
  for (size_t i = 0; i < out.size(); ++i) refuse_reduce_scatter_base(out[i], in[i], op, P);
}

void refuse_alltoall_base(const at::Tensor& out, const at::Tensor& in, bool out_equal, bool in_equal, int P) {
  if (!out.defined() || !in.defined()) return;
  if (out.scalar_type() != in.scalar_type())
    throw py::type_error("output: dtype " + dtype_of(out) + " differs from input's " + dtype_of(in));
  for (const auto& [t, equal, name] : {std::tuple<const at::Tensor&, bool, const char*>{out, out_equal, "output"},
                                       std::tuple<const at::Tensor&, bool, const char*>{in, in_equal, "input"}})
    if (equal && t.numel() % P)
      throw py::value_error(std::string(name) + ": " + num(t.numel()) + " elements do not split over " + num(P) +
                            " ranks (give " + name + "_split_sizes)");
}

namespace {
// data_movement.py's _gather_flat: one input into a list of one tensor per rank.
void refuse_gather_flat(const std::vector<at::Tensor>& outs, const at::Tensor& in, int P, int me) {
  if (outs.size() != static_cast<size_t>(P))
    throw py::value_error("output_tensor_list: has " + num(static_cast<int64_t>(outs.size())) + " tensors, expected " +
                          num(P));
  for (const auto& o : outs)
    if (o.defined() && o.scalar_type() != in.scalar_type())
      throw py::type_error("output_tensor_list: dtypes differ from the input's");
  if (outs[me].defined() && outs[me].numel() != in.numel())
    throw py::value_error("output_tensor_list[" + num(me) + "]: has " + num(outs[me].numel()) + " elements, input has " +
                          num(in.numel()));
}
}  // namespace

void refuse_allgather_list(const std::vector<std::vector<at::Tensor>>& out, const std::vector<at::Tensor>& in, int P,
                           int me) {
  if (in.size() != 1 || !in[0].defined()) return;  // (several inputs: several.cc)
  if (out.size() != in.size())
    throw py::value_error("output_tensors: has " + num(static_cast<int64_t>(out.size())) +
                          " lists, expected one per input (" + num(static_cast<int64_t>(in.size())) + ")");
  OneDevice().one("tensor", in[0]).list("tensor_list", out[0]);
  refuse_gather_flat(out[0], in[0], P, me);
}

void refuse_allgather_coalesced(const std::vector<std::vector<at::Tensor>>& out, const std::vector<at::Tensor>& in,
                                int P, int me) {
  if (out.size() != static_cast<size_t>(P))
    throw py::value_error("output_lists: has " + num(static_cast<int64_t>(out.size())) +
                          " lists, expected one per rank (" + num(P) + ")");
  for (size_t r = 0; r < out.size(); ++r)
    if (out[r].size() != in.size())
      throw py::value_error("output_lists[" + num(static_cast<int64_t>(r)) + "]: has " +
                            num(static_cast<int64_t>(out[r].size())) + " tensors, expected one per input (" +
                            num(static_cast<int64_t>(in.size())) + ")");
  OneDevice().list("input_tensor_list", in).lists("output_tensor_lists", out);
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].defined()) return;
    std::vector<at::Tensor> outs;
    for (const auto& per_rank : out) outs.push_back(per_rank[i]);
    refuse_gather_flat(outs, in[i], P, me);
  }
}

void refuse_reduce_scatter_list(const at::Tensor& out, const std::vector<at::Tensor>& in, const c10d::ReduceOp& op,
                                int P, int me) {
  if (!out.defined()) return;
  OneDevice().one("output", out).list("input_list", in);
  if (in.size() != static_cast<size_t>(P))
    throw py::value_error("input_list: has " + num(static_cast<int64_t>(in.size())) + " tensors, expected " + num(P));
  for (const auto& x : in)
    if (!x.defined()) return;
  if (in[me].numel() != out.numel())
    throw py::value_error("input_list[" + num(me) + "]: has " + num(in[me].numel()) + " elements, output has " +
                          num(out.numel()));
  // Equal blocks are concatenated (torch.cat promotes mixed dtypes); uneven ones are copied into a
  // buffer of the output's dtype (cast).
  bool equal = true;
  at::ScalarType cat = in[0].scalar_type();
  for (const auto& x : in) {
    equal = equal && x.numel() == in[0].numel();
    cat = at::promoteTypes(cat, x.scalar_type());
  }
  if (equal && cat != out.scalar_type())
    throw py::type_error("output: dtype " + dtype_of(out) + " differs from input's " + dtype_of(cat));
  refuse_reduction(out, op);
}

void refuse_alltoall_list(const std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in, int P) {
  OneDevice().list("input_tensor_list", in).list("output_tensor_list", out);
  if (out.size() != static_cast<size_t>(P) || in.size() != static_cast<size_t>(P))
    throw py::value_error("alltoall: expected " + num(P) + " output and " + num(P) + " input tensors");
  for (const auto* ts : {&out, &in})
    for (const auto& x : *ts)
      if (!x.defined() || !in[0].defined()) return;
  for (const auto* ts : {&out, &in})
    for (const auto& x : *ts)
      if (x.scalar_type() != in[0].scalar_type()) throw py::type_error("alltoall: all tensors must have the same dtype");
}

void refuse_rooted(bool gather, const std::vector<at::Tensor>& mine, const std::vector<std::vector<at::Tensor>>& lists,
                   int64_t root, int P, int me) {
  if (mine.size() != 1)
    throw py::value_error(gather ? "input_tensors: gather takes one input per call, got " + num(mine.size())
                                 : "output_tensors: scatter takes one output per call, got " + num(mine.size()));
  if (root == me && !lists.empty() && mine[0].defined()) {
    const char* name = gather ? "gather_list" : "scatter_list";
    const auto& listed = lists[0];
    if (listed.size() != static_cast<size_t>(P))
      throw py::value_error(std::string(name) + ": has " + num(static_cast<int64_t>(listed.size())) +
                            " tensors, expected " + num(P));
    for (size_t r = 0; r < listed.size(); ++r)
      if (!listed[r].defined() || listed[r].numel() != mine[0].numel() ||
          listed[r].scalar_type() != mine[0].scalar_type())
        throw py::value_error(std::string(name) + "[" + num(static_cast<int64_t>(r)) +
                              "]: size/dtype differs from the " + (gather ? "input" : "output") + "'s");
  }
  refuse_root(root, P);
}

}  // namespace torch_backend
}  // namespace commlib
