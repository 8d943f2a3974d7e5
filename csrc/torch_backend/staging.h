// The C++ backend's one staging layer (issue #44 item 3): a call whose tensors the core cannot take
// as they lie (not contiguous, a dtype or op the core does not reduce, a conjugate or negative view,
// the list forms of all_gather and reduce_scatter, all_to_all_single) becomes a StagedCall: the core's call on
// contiguous buffers made here (the inputs' values already copied in, with a cast), and what runs
// after the call (the copies back, with a cast, into the caller's tensors).
//
// Device-generic: the builders use only ATen ops that torch runs in order on the current stream for
// CUDA tensors (empty, copy_, zero_, views, narrow, reshape), so one code path serves CPU tensors
// (run_staged: the core's call, `after` as its finish) and CUDA ones (device_staged.cc: the call
// enqueued on the current stream by the stream engine, `after` enqueued on that stream behind it).
// The emulated device's test seam builds its StagedCall here too, over emulated memory (StageOn::alloc).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <functional>
#include <vector>

#include "bindings/core_api.h"

namespace commlib {
namespace torch_backend {

// Where a staged call's tensors live and how its buffers are made.
struct StageOn {
  // The caller's tensors' device: CPU (any index) for the core's calls and the emulated seam's
  // host views; a CUDA device: every tensor on that one device.
  c10::Device device = c10::Device(c10::kCPU);
  // A contiguous buffer of `sizes` with `options` (null: at::empty on the tensors' device; the
  // emulated seam's: emulated-device memory, which its engine can address).
  std::function<at::Tensor(at::IntArrayRef, const at::TensorOptions&)> alloc;

  at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options) const;
  // A strided tensor on `device` whose values a copy can read, and write back (an expanded output's
  // copy back raises torch's own error, as the Python backend's does).
  bool holds(const at::Tensor& t) const;
};

// One staged call: the core's call on the staged buffers, the buffers it reads or writes (held until
// it ran: on a device, until the engine retired it), and the copies back (null: none).
struct StagedCall {
  CollectiveCall call;
  std::vector<at::Tensor> keep;
  // The caller's inputs the call reads as they lie: held until an asynchronous call ran (its caller
  // may drop them before that, as `dist.reduce_scatter_tensor(out, torch.cat(...), async_op=True)`
  // does; a blocking call's caller holds them through it).
  std::vector<at::Tensor> inputs;
  std::function<void()> after;
  // Nothing was staged: the tensors go as they lie (the caller's unstaged entry already offered them).
  bool nothing_staged() const { return keep.empty() && !after; }
};

// The builders: false when the call is not one this layer stages (a tensor on another device, a
// dtype it cannot cast, sizes or dtypes that disagree, a root out of range: the Python backend
// then names the argument); a ValueError naming `op` for an op the dtype does not define. Nothing
// is copied when they return false or throw. `me`, `P`: this rank, the group's size; `algo`: the
// collective's CollectiveCall::algo.
//
// all_reduce (c AllReduce) or reduce (c Reduce, to `root`) of `t` in place, through a buffer of the
// staging dtype (reductions.cc reduction_of) when `t` is not one the core reduces as it lies.
bool stage_reduction(const StageOn& on, Collective c, const at::Tensor& t, const c10d::ReduceOp& op, int root, int me,
                     int P, uint8_t algo, StagedCall* s);
// reduce_scatter_tensor: `in` (P blocks of out's size) reduced, block `me` into `out`.
bool stage_reduce_scatter_base(const StageOn& on, const at::Tensor& out, const at::Tensor& in,
                               const c10d::ReduceOp& op, int P, uint8_t algo, StagedCall* s);
// reduce_scatter with a list: `in[j]` (one per rank, sizes may differ: padded to the largest, the
// padding reduced and thrown away) reduced, block `me` into `out`.
bool stage_reduce_scatter_list(const StageOn& on, const at::Tensor& out, const std::vector<at::Tensor>& in,
                               const c10d::ReduceOp& op, int P, int me, uint8_t algo, StagedCall* s);
// broadcast of `t` from `root` (any dtype: one the core knows as itself, any other as its bytes).
bool stage_broadcast(const StageOn& on, const at::Tensor& t, int root, int me, int P, uint8_t algo, StagedCall* s);
// all_gather_into_tensor: every rank's `in` side by side into `out`.
bool stage_allgather_base(const StageOn& on, const at::Tensor& out, const at::Tensor& in, int P, uint8_t algo,
                          StagedCall* s);
// all_gather with a list: rank j's `in` into outs[j] (equal sizes).
bool stage_allgather_list(const StageOn& on, const std::vector<at::Tensor>& outs, const at::Tensor& in, int P,
                          uint8_t algo, StagedCall* s);
// all_gather with an uneven list (sizes differ; every rank's list has the same sizes): each rank's
// `in` padded to the largest block, gathered side by side, block j's first outs[j].numel() values
// into outs[j]. (CPU tensors take several.cc's uneven_allgather instead: a batch of sends and
// receives of each block's own size, no padding.)
bool stage_allgather_uneven(const StageOn& on, const std::vector<at::Tensor>& outs, const at::Tensor& in, int P,
                            int me, uint8_t algo, StagedCall* s);
// all_to_all_single with equal blocks: `in` split in P equal blocks, block j to rank j, rank j's into
// block j of `out` (any dtype, moved as bytes).
bool stage_alltoall_base(const StageOn& on, const at::Tensor& out, const at::Tensor& in, int P, uint8_t algo,
                         StagedCall* s);

}  // namespace torch_backend
}  // namespace commlib
