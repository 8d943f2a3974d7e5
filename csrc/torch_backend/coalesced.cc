// CommlibBackend's coalesced collectives: the calls torch's _coalescing_manager makes for a block
// of all_reduce, all_gather_into_tensor or reduce_scatter_tensor calls (and functional
// collectives' *_coalesced), and all_gather_coalesced (lists), each run as one core call over one flat buffer: the tensors packed
// side by side, the result unpacked into each. Mixed dtypes: all-gathers move bytes and take any;
// reductions one call per dtype, each in its staging dtype (reduction_of). CUDA
// tensors: one call per tensor (pair), device_calls.cc's cuda_coalesced, a pair with a tensor to
// stage through staging.h's builder of its single form (device_staged.cc), all_gather_coalesced one
// staged list all-gather per input.
#include <algorithm>
#include <utility>

#include "torch_backend/argument_errors.h"
#include "torch_backend/backend.h"
#include "torch_backend/tensor_for_core.h"

namespace commlib {
namespace torch_backend {
namespace {

// `t`'s elements as bytes, viewed (P, n / P): one row per rank's block.
at::Tensor rank_rows(const at::Tensor& t, int64_t P) {
  at::Tensor c = dense(t);
  return at::from_blob(c.data_ptr(), {P, static_cast<int64_t>(c.nbytes()) / P},
                       [c](void*) {}, at::TensorOptions().dtype(at::kByte));
}

}  // namespace

c10::intrusive_ptr<c10d::Work> CommlibBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& out,
                                                                   std::vector<at::Tensor>& in,
                                                                   const c10d::AllgatherOptions& o) {
  // torch passes one output list per rank (out[r][i]: rank r's i-th input). One all-gather of every
  // input's bytes packed side by side (any mix of dtypes), unpacked into out[r][i] after.
  const size_t P = static_cast<size_t>(getSize());
  if (!in.empty() && in[0].defined() && in[0].is_cuda() && out.size() == P) {
    // CUDA tensors: input i's list all-gather (out[r][i] for every rank r), each staged (staging.h's
    // stage_allgather_list; a list always is) on the current stream, a pair the device entry declines
    // (the first call on a group and device) handed over alone; one work over them. Every pair is
    // checked first, so that a bad one makes none run here (argument_errors.h names what is wrong).
    refuse_allgather_coalesced(out, in, getSize(), getRank());
    for (size_t i = 0; i < in.size(); ++i)
      if (!in[i].defined() || in[i].device() != in[0].device()) return delegate("allgather_coalesced", out, in, o);
    // (ranks' blocks of an input may differ in size: this rank's is in[i]'s, the others padded to the
    // largest by stage_allgather_uneven, as the Python side pads them)
    for (size_t r = 0; r < out.size(); ++r) {
      const auto& per_rank = out[r];
      if (per_rank.size() != in.size()) return delegate("allgather_coalesced", out, in, o);
      for (size_t i = 0; i < in.size(); ++i)
        if (!per_rank[i].defined() || per_rank[i].device() != in[0].device() ||
            per_rank[i].scalar_type() != in[i].scalar_type() ||
            (static_cast<int>(r) == getRank() && per_rank[i].numel() != in[i].numel()))
          return delegate("allgather_coalesced", out, in, o);
    }
    std::vector<WorkPtr> works;
    for (size_t i = 0; i < in.size(); ++i) {
      std::vector<std::vector<at::Tensor>> outs(1);
      for (const auto& per_rank : out) outs[0].push_back(per_rank[i]);
      std::vector<at::Tensor> one{in[i]};
      WorkPtr w = cuda_staged(in[i], true, c10d::OpType::ALLGATHER, "all_gather", outs[0],
                              [&](const StageOn& on, StagedCall* s) {
                                return stage_allgather_list(on, outs[0], in[i], getSize(), algo(Collective::AllGather),
                                                            s) ||
                                       stage_allgather_uneven(on, outs[0], in[i], getSize(), getRank(),
                                                              algo(Collective::AllGather), s);
                              });
      works.push_back(w ? std::move(w) : delegate("allgather", outs, one, o));
    }
    return c10::make_intrusive<CoalescedWork>(getRank(), std::move(works));
  }
  // Ranks' blocks of an input may differ in size (out[r][i] is rank r's; this rank's is in[i]'s):
  // each input's slot is its largest block, this rank's padded to it (the padding moved and never
  // read), as the Python side pads its per-input all-gathers; every rank sees the same sizes, so
  // every rank takes this path alike.
  const size_t me = static_cast<size_t>(getRank());
  bool ours = !in.empty() && out.size() == P;
  std::vector<int64_t> slot(in.size(), 0);  // input i's bytes per rank in the flat buffers
  for (size_t i = 0; ours && i < in.size(); ++i) ours = host_layout(in[i]);
  for (size_t r = 0; ours && r < P; ++r) {
    ours = out[r].size() == in.size();
    for (size_t i = 0; ours && i < in.size(); ++i) {
      ours = host_layout(out[r][i]) && out[r][i].scalar_type() == in[i].scalar_type() &&
             (r != me || out[r][i].numel() == in[i].numel());
      slot[i] = std::max<int64_t>(slot[i], ours ? static_cast<int64_t>(out[r][i].nbytes()) : 0);
    }
  }
  if (!ours) {
    refuse_allgather_coalesced(out, in, getSize(), getRank());  // (argument_errors.h: before any hand-over)
    return delegate("allgather_coalesced", out, in, o);
  }
  int64_t bytes = 0;  // one rank's part of the flat buffers
  bool padded = false;
  for (size_t i = 0; i < in.size(); ++i) {
    bytes += slot[i];
    padded = padded || slot[i] != static_cast<int64_t>(in[i].nbytes());
  }
  at::Tensor flat_in = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  if (padded) flat_in.zero_();  // (the padding is never read; zeroed so that no stale memory is sent)
  for (size_t i = 0, off = 0; i < in.size(); off += slot[i], ++i)
    flat_in.narrow(0, static_cast<int64_t>(off), static_cast<int64_t>(in[i].nbytes())).copy_(bytes_of(dense(in[i])));
  at::Tensor flat_out = at::empty({bytes * static_cast<int64_t>(P)}, at::TensorOptions().dtype(at::kByte));
  std::vector<at::Tensor> outputs;
  for (const auto& per_rank : out) outputs.insert(outputs.end(), per_rank.begin(), per_rank.end());
  auto call = make_call(Collective::AllGather, algo(Collective::AllGather), DType::UInt8, bytes, address(flat_in),
                        address(flat_out));
  std::vector<std::vector<at::Tensor>> outs = out;
  return run(call, o.asyncOp, c10d::OpType::ALLGATHER_COALESCED, "all_gather_coalesced", outputs,
             [flat_in, flat_out, outs, bytes, slot]() mutable {
               for (size_t r = 0; r < outs.size(); ++r) {
                 int64_t off = static_cast<int64_t>(r) * bytes;
                 for (size_t i = 0; i < outs[r].size(); ++i) {
                   at::Tensor& t = outs[r][i];
                   at::Tensor c = dense(t);
                   bytes_of(c).copy_(flat_out.narrow(0, off, static_cast<int64_t>(c.nbytes())));
                   if (!c.is_same(t)) t.copy_(c);
                   off += slot[i];
                 }
               }
             },
             o.timeout);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::allreduce_coalesced(std::vector<at::Tensor>& t,
                                                                   const c10d::AllreduceCoalescedOptions& o) {
  auto one = [&t](size_t i) { return std::vector<at::Tensor>{t[i]}; };
  auto cuda_one = [&](size_t i) {
    auto v = one(i);
    if (auto w = cuda_reduction(Collective::AllReduce, v, o.reduceOp, 0, c10d::OpType::ALLREDUCE, "all_reduce"))
      return w;
    return cuda_staged(t[i], false, c10d::OpType::ALLREDUCE, "all_reduce", v, [&](const StageOn& on, StagedCall* s) {
      return stage_reduction(on, Collective::AllReduce, t[i], o.reduceOp, 0, getRank(), getSize(),
                             algo(Collective::AllReduce), s);
    });
  };
  auto hand_over_one = [&](size_t i) {
    c10d::AllreduceOptions single;
    single.reduceOp = o.reduceOp;
    single.timeout = o.timeout;
    single.asyncOp = o.asyncOp;
    return delegate("allreduce", one(i), single);
  };
  if (!t.empty() && t[0].defined() && t[0].is_cuda()) {  // an op a dtype does not define: before any is enqueued
    refuse_reductions(t, o.reduceOp);  // (argument_errors.h, in the Python side's order: devices, then each op)
    Reduction r;
    for (const auto& x : t)
      if (x.defined()) reduction_in(x, o.reduceOp, &r);
  }
  if (auto w = cuda_coalesced(t, t, cuda_one, hand_over_one)) return w;
  // One call per dtype (in the order each first appears), each over one flat buffer of its staging
  // dtype (reduction_of: a dtype the core does not reduce is cast, complex as pairs of reals); one
  // work over them when there are several.
  std::vector<std::vector<size_t>> groups;
  std::vector<Reduction> kinds;
  for (size_t i = 0; i < t.size(); ++i) {
    Reduction r;
    if (!reduction_of(t[i], o.reduceOp, &r)) {
      refuse_reductions(t, o.reduceOp);
      return delegate("allreduce_coalesced", t, o);
    }
    size_t g = 0;
    while (g < groups.size() && t[groups[g][0]].scalar_type() != t[i].scalar_type()) ++g;
    if (g == groups.size()) {
      groups.emplace_back();
      kinds.push_back(r);
    }
    groups[g].push_back(i);
  }
  if (groups.empty()) return delegate("allreduce_coalesced", t, o);
  std::vector<WorkPtr> works;
  for (size_t g = 0; g < groups.size(); ++g) {
    const Reduction& r = kinds[g];
    int64_t total = 0;
    for (size_t i : groups[g]) total += t[i].numel();
    at::Tensor flat = at::empty({total}, t[groups[g][0]].options().dtype(r.stage));
    std::vector<at::Tensor> outs;
    int64_t off = 0;
    for (size_t i : groups[g]) {
      flat.narrow(0, off, t[i].numel()).copy_(t[i].reshape({-1}));  // (casts; resolves views)
      off += t[i].numel();
      outs.push_back(t[i]);
    }
    auto call = make_call(Collective::AllReduce, algo(Collective::AllReduce), r.dt, total * r.reals, address(flat),
                          address(flat));
    call.op = r.op;
    call.scale = r.scale;
    works.push_back(run(call, o.asyncOp, c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", outs,
                        [flat, outs]() mutable {
                          int64_t at = 0;
                          for (auto& x : outs) {
                            x.copy_(flat.narrow(0, at, x.numel()).view(x.sizes()));
                            at += x.numel();
                          }
                        },
                        o.timeout));
  }
  if (works.size() == 1) return works[0];
  return c10::make_intrusive<CoalescedWork>(getRank(), std::move(works));
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& out,
                                                                               std::vector<at::Tensor>& in,
                                                                               const c10d::AllgatherOptions& o) {
  if (!in.empty() && in[0].defined() && in[0].is_cuda())  // every pair checked before any is enqueued
    refuse_allgather_pairs(out, in, getSize());
  if (auto w = cuda_coalesced(
          out, in,
          [&](size_t i) -> WorkPtr {
            if (auto w = cuda_allgather_base(out[i], in[i])) return w;
            return cuda_staged(in[i], true, c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {out[i]},
                               [&](const StageOn& on, StagedCall* s) {
                                 return stage_allgather_base(on, out[i], in[i], getSize(), algo(Collective::AllGather),
                                                             s);
                               });
          },
          [&](size_t i) { return delegate("_allgather_base", out[i], in[i], o); }))
    return w;
  const int64_t P = getSize();
  bool ours = !in.empty() && in.size() == out.size();
  for (size_t i = 0; ours && i < in.size(); ++i)
    ours = host_layout(in[i]) && host_layout(out[i]) && in[i].scalar_type() == out[i].scalar_type() &&
           out[i].numel() == in[i].numel() * P;
  if (!ours) {
    refuse_allgather_pairs(out, in, getSize());
    return delegate("allgather_into_tensor_coalesced", out, in, o);
  }
  // Input i's bytes at [off_i, off_i + b_i) of every rank's block of S bytes.
  std::vector<at::Tensor> parts;
  std::vector<int64_t> offs, sizes;
  int64_t S = 0;
  for (const auto& x : in) {
    parts.push_back(rank_rows(x, 1).reshape({-1}));
    offs.push_back(S);
    sizes.push_back(static_cast<int64_t>(x.nbytes()));
    S += sizes.back();
  }
  at::Tensor flat_in = at::cat(parts);
  at::Tensor flat_out = at::empty({P * S}, at::TensorOptions().dtype(at::kByte));
  auto call = make_call(Collective::AllGather, algo(Collective::AllGather), DType::UInt8, S, address(flat_in),
                        address(flat_out), 0);
  std::vector<at::Tensor> outs = out;
  return run(call, o.asyncOp, c10d::OpType::COALESCED, "all_gather_into_tensor_coalesced", out,
             [flat_in, flat_out, outs, offs, sizes, P, S]() mutable {
               at::Tensor rows = flat_out.view({P, S});
               for (size_t i = 0; i < outs.size(); ++i) {
                 at::Tensor staged = dense(outs[i]);
                 rank_rows(staged, P).copy_(rows.narrow(1, offs[i], sizes[i]));
                 if (!staged.is_same(outs[i])) outs[i].copy_(staged);
               }
             },
             o.timeout);
}

c10::intrusive_ptr<c10d::Work> CommlibBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& out,
                                                                               std::vector<at::Tensor>& in,
                                                                               const c10d::ReduceScatterOptions& o) {
  if (!out.empty() && out[0].defined() && out[0].is_cuda()) {  // (as allreduce_coalesced)
    refuse_reduce_scatter_pairs(out, in, o.reduceOp, getSize());  // (the Python side's order: lengths, then each pair)
    Reduction r;
    for (const auto& x : out)
      if (x.defined()) reduction_in(x, o.reduceOp, &r);
  }
  if (auto w = cuda_coalesced(
          out, in,
          [&](size_t i) -> WorkPtr {
            if (auto w = cuda_reduce_scatter_base(out[i], in[i], o.reduceOp)) return w;
            return cuda_staged(out[i], true, c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {out[i]},
                               [&](const StageOn& on, StagedCall* s) {
                                 return stage_reduce_scatter_base(on, out[i], in[i], o.reduceOp, getSize(),
                                                                  algo(Collective::ReduceScatter), s);
                               });
          },
          [&](size_t i) { return delegate("_reduce_scatter_base", out[i], in[i], o); }))
    return w;
  // One call per dtype (in the order each first appears, as allreduce_coalesced groups them), each
  // through its staging dtype (reduction_of); one work over them when there are several.
  const int64_t P = getSize();
  std::vector<std::vector<size_t>> groups;
  std::vector<Reduction> kinds;
  bool ours = !in.empty() && in.size() == out.size();
  for (size_t i = 0; ours && i < in.size(); ++i) {
    ours = host_layout(in[i]) && host_layout(out[i]) && out[i].scalar_type() == in[i].scalar_type() &&
           in[i].numel() == out[i].numel() * P;
    size_t g = 0;
    while (ours && g < groups.size() && in[groups[g][0]].scalar_type() != in[i].scalar_type()) ++g;
    if (ours && g == groups.size()) {
      Reduction r;  // (a dtype the core does not reduce through its staging dtype)
      ours = reduction_of(in[i], o.reduceOp, &r);
      groups.emplace_back();
      kinds.push_back(r);
    }
    if (ours) groups[g].push_back(i);
  }
  if (!ours) {
    refuse_reduce_scatter_pairs(out, in, o.reduceOp, getSize());
    return delegate("reduce_scatter_tensor_coalesced", out, in, o);
  }
  std::vector<WorkPtr> works;
  for (size_t g = 0; g < groups.size(); ++g) {
    const Reduction& r = kinds[g];
    // Rank r's block of the packed input: block r of every input of the group side by side (S elements).
    std::vector<int64_t> offs, counts;
    std::vector<at::Tensor> outs;
    int64_t S = 0;
    for (size_t i : groups[g]) {
      offs.push_back(S);
      counts.push_back(out[i].numel());
      outs.push_back(out[i]);
      S += out[i].numel();
    }
    at::Tensor flat_in = at::empty({P, S}, in[groups[g][0]].options().dtype(r.stage));
    for (size_t k = 0; k < groups[g].size(); ++k)
      flat_in.narrow(1, offs[k], counts[k]).copy_(in[groups[g][k]].reshape({P, counts[k]}));
    at::Tensor flat_out = at::empty({S}, flat_in.options());
    auto call = make_call(Collective::ReduceScatter, algo(Collective::ReduceScatter), r.dt, S * r.reals,
                          address(flat_in), address(flat_out));
    call.op = r.op;
    call.scale = r.scale;
    works.push_back(run(call, o.asyncOp, c10d::OpType::COALESCED, "reduce_scatter_tensor_coalesced", outs,
                        [flat_in, flat_out, outs, offs, counts]() mutable {
                          for (size_t i = 0; i < outs.size(); ++i)
                            outs[i].copy_(flat_out.narrow(0, offs[i], counts[i]).view(outs[i].sizes()));
                        },
                        o.timeout));
  }
  if (works.size() == 1) return works[0];
  return c10::make_intrusive<CoalescedWork>(getRank(), std::move(works));
}

}  // namespace torch_backend
}  // namespace commlib
