// CommlibBackend's calls of several tensors, uneven all_gather lists and sparse all_reduce on CPU
// tensors, run on the core from here (issue #44 item 3: torch hands a backend each of these, so none
// needs the Python backend).
//
// Several tensors in one call follow torch's contract for a tensor list, which gloo implements (and
// ProcessGroupNCCL, which refuses lists now, did): the tensors are this rank's contributions, as if
// from several devices. all_reduce reduces every tensor of every rank into each; broadcast sends the
// root's tensors[opts.rootTensor] into every tensor of every rank; all_gather gathers every input of
// every rank into each output list (output_tensors[i][r * k + j]: rank r's input j). Calls gloo
// refuses with several tensors (reduce, reduce_scatter, send, recv) are refused the same way.
#include <string>
#include <utility>

#include "torch_backend/backend.h"
#include "torch_backend/tensor_for_core.h"

namespace py = pybind11;

namespace commlib {
namespace torch_backend {
namespace {

// `t`'s values, contiguous and resolved (no conjugate or negative view): what a send reads.
at::Tensor readable(const at::Tensor& t) {
  return t.is_contiguous() && !t.is_conj() && !t.is_neg() ? t : t.resolve_conj().resolve_neg().contiguous();
}

// Where a receive into `t` lands: `t` when the core can write it as it lies, else a contiguous
// tensor copied into it after (CopyBack).
at::Tensor writable(const at::Tensor& t, CopyBack* back) {
  if (t.is_contiguous() && !t.is_conj() && !t.is_neg()) return t;
  at::Tensor staged = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
  back->add(t, staged);
  return staged;
}

// Every tensor of `ts` a CPU strided tensor of `like`'s dtype and shape; ValueError naming the first
// that is not (torch's contract for a list: gloo's "invalid tensor size/type").
void check_like(const std::vector<at::Tensor>& ts, const at::Tensor& like, const char* name) {
  for (size_t i = 0; i < ts.size(); ++i) {
    const at::Tensor& t = ts[i];
    if (!host_layout(t) || t.scalar_type() != like.scalar_type() || t.sizes() != like.sizes())
      throw py::value_error(std::string(name) + "[" + std::to_string(i) + "]: every tensor of the list must be a " +
                            "CPU tensor of the first one's dtype and shape");
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> CommlibBackend::several_allreduce(std::vector<at::Tensor>& t,
                                                                 const c10d::AllreduceOptions& o) {
  Reduction r;
  if (t.empty() || !reduction_of(t[0], o.reduceOp, &r)) return nullptr;
  check_like(t, t[0], "tensors");
  // This rank's tensors reduced in list order (the same order on every rank), then across ranks.
  at::Tensor acc = at::empty(t[0].sizes(), t[0].options().dtype(r.stage).memory_format(at::MemoryFormat::Contiguous));
  acc.copy_(t[0]);
  for (size_t i = 1; i < t.size(); ++i) {
    at::Tensor x = staged_for(t[i], r);
    switch (r.op) {
      case RedOp::Prod: acc.mul_(x); break;
      case RedOp::Min: at::minimum_out(acc, acc, x); break;
      case RedOp::Max: at::maximum_out(acc, acc, x); break;
      case RedOp::BAnd: acc.bitwise_and_(x); break;
      case RedOp::BOr: acc.bitwise_or_(x); break;
      case RedOp::BXor: acc.bitwise_xor_(x); break;
      default: acc.add_(x);  // sum, avg and premul_sum (the factor distributes over the sum)
    }
  }
  auto call = make_call(Collective::AllReduce, algo(Collective::AllReduce), r.dt, acc.numel() * r.reals, address(acc),
                        address(acc));
  call.op = r.op;
  call.scale = r.scale;
  const bool average = r.op == RedOp::Avg;  // the core averaged over ranks: over the tensors too
  const auto k = static_cast<int64_t>(t.size());
  std::vector<at::Tensor> outs = t;
  return run(call, o.asyncOp, c10d::OpType::ALLREDUCE, "all_reduce", t,
             [acc, outs, average, k]() mutable {
               if (average) acc.div_(k);
               for (auto& x : outs) x.copy_(acc);
             },
             o.timeout);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::several_broadcast(std::vector<at::Tensor>& t,
                                                                 const c10d::BroadcastOptions& o) {
  if (!host_layout(t[0])) return nullptr;
  check_like(t, t[0], "tensors");
  if (o.rootTensor < 0 || o.rootTensor >= static_cast<int64_t>(t.size()))
    throw py::value_error("rootTensor: " + std::to_string(o.rootTensor) + " is not an index of the " +
                          std::to_string(t.size()) + " tensors");
  // The root tensor's bytes (any dtype), then copied into every other tensor of the list.
  CopyBack back;
  at::Tensor& root_tensor = t[static_cast<size_t>(o.rootTensor)];
  at::Tensor c = getRank() == o.rootRank ? readable(root_tensor) : writable(root_tensor, &back);
  auto call = make_call(Collective::Broadcast, algo(Collective::Broadcast), DType::UInt8,
                        static_cast<int64_t>(c.nbytes()), address(c), address(c), static_cast<int>(o.rootRank));
  std::vector<at::Tensor> outs = t;
  return run(call, o.asyncOp, c10d::OpType::BROADCAST, "broadcast", t,
             [c, back, outs]() mutable {
               back();
               for (auto& x : outs)
                 if (!x.is_same(c)) x.copy_(c);
             },
             o.timeout);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::several_allgather(std::vector<std::vector<at::Tensor>>& out,
                                                                 std::vector<at::Tensor>& in,
                                                                 const c10d::AllgatherOptions& o) {
  if (!host_layout(in[0])) return nullptr;
  check_like(in, in[0], "input_tensors");
  const auto k = static_cast<int64_t>(in.size()), P = static_cast<int64_t>(getSize());
  if (out.size() != in.size())
    throw py::value_error("output_tensors: has " + std::to_string(out.size()) + " lists, expected one per input (" +
                          std::to_string(k) + ")");
  for (size_t i = 0; i < out.size(); ++i) {
    if (static_cast<int64_t>(out[i].size()) != P * k)
      throw py::value_error("output_tensors[" + std::to_string(i) + "]: has " + std::to_string(out[i].size()) +
                            " tensors, expected world_size * inputs = " + std::to_string(P * k));
    check_like(out[i], in[0], ("output_tensors[" + std::to_string(i) + "]").c_str());
  }
  // Every input side by side (as bytes), gathered from every rank, unpacked into each list.
  const int64_t n = in[0].numel();
  at::Tensor flat_in = at::empty({k * n}, in[0].options().memory_format(at::MemoryFormat::Contiguous));
  for (int64_t j = 0; j < k; ++j) flat_in.narrow(0, j * n, n).copy_(in[j].reshape({-1}));
  at::Tensor flat_out = at::empty({P * k * n}, flat_in.options());
  auto call = make_call(Collective::AllGather, algo(Collective::AllGather), DType::UInt8,
                        static_cast<int64_t>(flat_in.nbytes()), address(flat_in), address(flat_out));
  std::vector<std::vector<at::Tensor>> lists = out;
  std::vector<at::Tensor> outputs;
  for (const auto& l : out) outputs.insert(outputs.end(), l.begin(), l.end());
  return run(call, o.asyncOp, c10d::OpType::ALLGATHER, "all_gather", outputs,
             [flat_in, flat_out, lists, n]() mutable {
               for (auto& l : lists)
                 for (size_t b = 0; b < l.size(); ++b)
                   l[b].copy_(flat_out.narrow(0, static_cast<int64_t>(b) * n, n).view(l[b].sizes()));
             },
             o.timeout);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::uneven_allgather(std::vector<at::Tensor>& outs, const at::Tensor& in,
                                                                const c10d::AllgatherOptions& o) {
  // Blocks of different sizes: one batch of sends and receives (this rank's input to every peer,
  // peer j's into outs[j]), this rank's own block copied after it; any dtype, moved as bytes.
  const int P = getSize(), me = getRank();
  if (static_cast<int>(outs.size()) != P || !host_layout(in) || outs[me].numel() != in.numel()) return nullptr;
  for (const auto& t : outs)
    if (!host_layout(t) || t.scalar_type() != in.scalar_type()) return nullptr;  // (the Python side names it)
  at::Tensor src = readable(in);
  CopyBack back;
  std::vector<at::Tensor> targets(P);
  std::vector<P2PItem> items;
  for (int j = 0; j < P; ++j) {
    if (j == me) continue;
    targets[j] = writable(outs[j], &back);
    items.push_back(P2PItem{true, address(src), static_cast<int64_t>(src.nbytes()), j});
    items.push_back(P2PItem{false, address(targets[j]), static_cast<int64_t>(targets[j].nbytes()), j});
  }
  at::Tensor own = outs[me];
  return run_items(items, DType::UInt8, -1, o.asyncOp, c10d::OpType::ALLGATHER, "all_gather", outs,
                   [src, targets, own, back]() mutable {
                     own.copy_(src.view(own.sizes()));
                     back();
                   },
                   o.timeout);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::allreduce_sparse(std::vector<at::Tensor>& t,
                                                                const c10d::AllreduceOptions& o) {
  // As gloo: every rank's (coalesced) indices and values gathered, then summed into one coalesced
  // tensor that replaces t's contents; blocking (each step needs the previous one's sizes).
  if (t.size() != 1 || !t[0].is_sparse() || !t[0].device().is_cpu()) return delegate("allreduce", t, o);
  if (o.reduceOp.op_ != c10d::ReduceOp::SUM)
    throw py::value_error("op: sparse tensors are reduced with SUM only");
  hold_->flush();
  if (p2p_handed_over_) flush_held_p2p();
  seq_.fetch_add(1);
  const int P = getSize(), me = getRank();
  const double secs = timeout_seconds(o.timeout);
  at::Tensor src = t[0].coalesce();
  at::Tensor idx = src.indices().contiguous(), val = src.values().contiguous();
  const int64_t nnz = idx.size(1);
  // 1. every rank's count of non-zeros
  at::Tensor mine = at::full({1}, nnz, at::TensorOptions().dtype(at::kLong));
  at::Tensor counts = at::empty({P}, mine.options());
  CoreError err;
  auto call = make_call(Collective::AllGather, algo(Collective::AllGather), DType::Int64, 1, address(mine),
                        address(counts));
  if (!api_->collective(core_, call, false, secs, nullptr, &err)) raise_core_error(err, "all_reduce", me);
  // 2. indices and values of every rank: one batch, a block per peer (indices' bytes, then values')
  const int64_t per_index = idx.size(0) * 8;
  int64_t value_bytes = val.element_size();  // one non-zero's values (hybrid tensors: a dense block)
  for (int64_t d = 1; d < val.dim(); ++d) value_bytes *= val.size(d);
  at::Tensor packed = at::cat({idx.view(-1).view(at::kByte), val.view(-1).view(at::kByte)});
  std::vector<at::Tensor> blocks(P);
  std::vector<P2PItem> items;
  for (int j = 0; j < P; ++j) {
    const int64_t c = counts[j].item<int64_t>();
    blocks[j] = j == me ? packed : at::empty({c * (per_index + value_bytes)}, packed.options());
    if (j == me) continue;
    items.push_back(P2PItem{true, address(packed), static_cast<int64_t>(packed.nbytes()), j});
    items.push_back(P2PItem{false, address(blocks[j]), static_cast<int64_t>(blocks[j].nbytes()), j});
  }
  if (!items.empty() && !api_->p2p(core_, items.data(), items.size(), DType::UInt8, false, secs, nullptr, &err))
    raise_core_error(err, "all_reduce", me);
  // 3. summed, in rank order (every rank alike)
  std::vector<at::Tensor> indices, values;
  std::vector<int64_t> value_shape(val.sizes().begin(), val.sizes().end());
  for (int j = 0; j < P; ++j) {
    const int64_t c = counts[j].item<int64_t>();
    indices.push_back(blocks[j].narrow(0, 0, c * per_index).view(at::kLong).view({idx.size(0), c}));
    value_shape[0] = c;
    values.push_back(blocks[j].narrow(0, c * per_index, c * value_bytes).view(val.scalar_type()).view(value_shape));
  }
  at::Tensor total = at::sparse_coo_tensor(at::cat(indices, 1), at::cat(values, 0), t[0].sizes(),
                                            val.options().layout(at::kSparse))
                         .coalesce();
  at::Tensor target = t[0];
  run_finish([&] { target.copy_(total); });
  return track(c10::make_intrusive<CommlibWork>(api_, c10d::OpType::ALLREDUCE, "all_reduce", me, t, nullptr, nullptr));
}

}  // namespace torch_backend
}  // namespace commlib
