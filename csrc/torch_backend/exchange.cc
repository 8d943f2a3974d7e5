// CommlibBackend's all-to-all calls: all_to_all_single (alltoall_base) with equal blocks as the
// core's all_to_all collective (staging.h's stage_alltoall_base for tensors the core cannot take as
// they lie, on either device), with split sizes as one batch of sends and receives (the core's
// all_to_allv, as commlib/core/p2p_plan.py plans it for the Python side; on CUDA tensors the stream
// engine's batch, device_p2p.cc), and the list form
// (alltoall) through one flat buffer each way. Any dtype goes: blocks move as the tensor's elements
// where the core knows its dtype, else as bytes (a_to_a_dtype, as the Python backend moves them).
// Both batches are numbered as a collective (the core's all_to_allv, core_api.h; session 28: they
// were plain point-to-point batches, so a dead peer's error named "send #n", and a rank whose call
// went through the Python backend took a call number the others did not).
#include <string>
#include <utility>

#include "torch_backend/argument_errors.h"
#include "torch_backend/backend.h"
#include "torch_backend/tensor_for_core.h"

namespace py = pybind11;

namespace commlib {
namespace torch_backend {
namespace {

// Bytes per rank of one side of all_to_all_single: split sizes count rows of dim 0; none means
// equal blocks. Refused (ValueError naming the argument) when they do not add up.
std::vector<int64_t> block_bytes(const at::Tensor& t, const std::vector<int64_t>& splits, int size, const char* name,
                                 const char* tensor_name) {
  if (splits.empty()) {  // equal blocks of elements (as gloo)
    if (t.numel() % size)
      throw py::value_error(std::string(tensor_name) + ": " + std::to_string(t.numel()) + " elements do not split over " +
                            std::to_string(size) + " ranks (give " + name + ")");
    return std::vector<int64_t>(size, static_cast<int64_t>(t.nbytes()) / size);
  }
  const int64_t rows = t.dim() ? t.size(0) : 1;
  const int64_t row_bytes = rows ? static_cast<int64_t>(t.nbytes()) / rows : 0;
  if (static_cast<int>(splits.size()) != size)
    throw py::value_error(std::string(name) + ": has " + std::to_string(splits.size()) + " sizes, expected one per rank (" +
                          std::to_string(size) + ")");
  int64_t total = 0;
  std::vector<int64_t> out;
  for (int64_t s : splits) {
    if (s < 0) throw py::value_error(std::string(name) + ": negative size " + std::to_string(s));
    total += s;
    out.push_back(s * row_bytes);
  }
  if (total != rows)
    throw py::value_error(std::string(name) + ": sizes add up to " + std::to_string(total) + " rows, " + tensor_name +
                          " has " + std::to_string(rows));
  return out;
}

std::vector<int64_t> offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> off(sizes.size(), 0);
  for (size_t j = 1; j < sizes.size(); ++j) off[j] = off[j - 1] + sizes[j - 1];
  return off;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> CommlibBackend::exchange(const at::Tensor& in, const at::Tensor& out,
                                                        const std::vector<int64_t>& in_bytes,
                                                        const std::vector<int64_t>& out_bytes, DType dt,
                                                        bool async, c10d::OpType type, const char* name,
                                                        std::vector<at::Tensor> outputs, std::function<void()> finish,
                                                        std::chrono::milliseconds timeout) {
  const int me = getRank();
  if (in_bytes[me] != out_bytes[me])
    throw py::value_error("input_split_sizes/output_split_sizes: this rank sends itself " + std::to_string(in_bytes[me]) +
                          " bytes but expects " + std::to_string(out_bytes[me]));
  const auto in_off = offsets(in_bytes), out_off = offsets(out_bytes);
  const int64_t es = element_bytes(dt);  // (every block a whole number of elements)
  std::vector<P2PItem> items;
  int64_t sent = 0;
  for (int j = 0; j < getSize(); ++j) {
    sent += in_bytes[j] / es;
    if (j == me) continue;
    items.push_back(P2PItem{true, address(in) + in_off[j], in_bytes[j] / es, j});
    items.push_back(P2PItem{false, address(out) + out_off[j], out_bytes[j] / es, j});
  }
  // This rank's own block is copied once the batch ran (after every call queued before it, which
  // may still be writing the input).
  at::Tensor own_src = bytes_of(in).narrow(0, in_off[me], in_bytes[me]);
  at::Tensor own_dst = bytes_of(out).narrow(0, out_off[me], out_bytes[me]);
  return run_items(items, dt, sent, async, type, name, std::move(outputs),
                   [in, out, own_src, own_dst, finish]() {
                     own_dst.copy_(own_src);
                     if (finish) finish();
                   },
                   timeout);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::alltoall_base(at::Tensor& out, at::Tensor& in,
                                                             std::vector<int64_t>& out_splits,
                                                             std::vector<int64_t>& in_splits,
                                                             const c10d::AllToAllOptions& o) {
  if (out_splits.empty() && in_splits.empty()) {
    if (auto w = cuda_alltoall_base(out, in)) return w;
    if (in.defined() && in.is_cuda()) {  // not contiguous, or a conjugate or negative view: staged
      auto build = [&](const StageOn& on, StagedCall* s) {
        return stage_alltoall_base(on, out, in, getSize(), algo(Collective::AllToAll), s);
      };
      if (auto w = cuda_staged(in, true, c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {out}, build)) return w;
    }
  } else if (device_p2p_layout(in) && device_p2p_layout(out) && in.device() == out.device() &&
             in.scalar_type() == out.scalar_type()) {  // CUDA tensors: one batch of the stream engine
    at::Tensor ci = dense(in), co = dense(out);
    const auto in_bytes = block_bytes(ci, in_splits, getSize(), "input_split_sizes", "input");
    const auto out_bytes = block_bytes(co, out_splits, getSize(), "output_split_sizes", "output");
    if (co.numel() && ci.numel() && co.data_ptr() == ci.data_ptr()) ci = ci.clone();  // in place: send from a copy
    const c10::Stream s = current_stream(in.device());
    return device_exchange(ci, co, in_bytes, out_bytes, a_to_a_dtype(ci), kCudaBuffer, in.device().index(),
                           reinterpret_cast<uintptr_t>(s.native_handle()), s, co.is_same(out) ? at::Tensor() : out);
  }
  StagedCall staged;  // CPU tensors, equal blocks: the core's all_to_all through the staging layer, as CUDA's
  if (out_splits.empty() && in_splits.empty() && in.defined() && in.device().is_cpu() &&
      stage_alltoall_base(StageOn(), out, in, getSize(), algo(Collective::AllToAll), &staged))
    return run_staged(std::move(staged), o.asyncOp, c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {out},
                      o.timeout);
  if (out_splits.empty() && in_splits.empty())  // (declined equal blocks: named as the Python side names them)
    refuse_alltoall_base(out, in, true, true, getSize());
  if (!host_layout(in) || !host_layout(out) || in.scalar_type() != out.scalar_type()) {
    refuse_alltoall_base(out, in, out_splits.empty(), in_splits.empty(), getSize());  // (argument_errors.h)
    return delegate("alltoall_base", out, in, out_splits, in_splits, o);
  }
  const int P = getSize();
  at::Tensor ci = dense(in), co = dense(out);
  CopyBack back;
  back.add(out, co);
  const auto in_bytes = block_bytes(ci, in_splits, P, "input_split_sizes", "input");
  const auto out_bytes = block_bytes(co, out_splits, P, "output_split_sizes", "output");
  if (co.numel() && ci.numel() && co.data_ptr() == ci.data_ptr()) ci = ci.clone();  // in place: send from a copy
  return exchange(ci, co, in_bytes, out_bytes, a_to_a_dtype(ci), o.asyncOp, c10d::OpType::ALLTOALL_BASE,
                  "all_to_all_single", {out},
                  back.empty() ? nullptr : std::function<void()>(back), o.timeout);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                                        const c10d::AllToAllOptions& o) {
  if (auto w = cuda_alltoall(out, in)) return w;  // CUDA tensors: one batch of the stream engine
  const size_t P = static_cast<size_t>(getSize());
  bool ours = out.size() == P && in.size() == P;
  for (size_t i = 0; ours && i < P; ++i)
    ours = host_layout(in[i]) && host_layout(out[i]) && in[i].scalar_type() == in[0].scalar_type() &&
           out[i].scalar_type() == in[0].scalar_type();
  if (!ours) {
    refuse_alltoall_list(out, in, getSize());
    return delegate("alltoall", out, in, o);
  }
  std::vector<at::Tensor> blocks;
  std::vector<int64_t> in_bytes, out_bytes;
  for (size_t i = 0; i < P; ++i) {
    blocks.push_back(bytes_of(dense(in[i])).clone());
    in_bytes.push_back(static_cast<int64_t>(in[i].nbytes()));
    out_bytes.push_back(static_cast<int64_t>(out[i].nbytes()));
  }
  at::Tensor flat_in = at::cat(blocks);
  int64_t total = 0;
  for (int64_t b : out_bytes) total += b;
  at::Tensor flat_out = at::empty({total}, at::TensorOptions().dtype(at::kByte));
  std::vector<at::Tensor> outs = out;
  auto unpack = [flat_out, outs, out_bytes]() mutable {
    int64_t off = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      at::Tensor block = flat_out.narrow(0, off, out_bytes[i]);
      outs[i].copy_(block.view(outs[i].scalar_type()).view(outs[i].sizes()));
      off += out_bytes[i];
    }
  };
  return exchange(flat_in, flat_out, in_bytes, out_bytes, a_to_a_dtype(in[0]), o.asyncOp, c10d::OpType::ALLTOALL,
                  "all_to_all", out, unpack, o.timeout);
}

}  // namespace torch_backend
}  // namespace commlib
