// Argument errors the C++ backend raises itself (issue #44 item 3), where it used to hand the call to
// the Python backend so that it would name the argument. Each `refuse_*` throws what the Python
// backend (commlib/torch/backend.py, data_movement.py, and the communicator's call_checks.py behind
// them) raises for the same call: the same class (ValueError, TypeError) with the same text, checked
// in the same order, so a call with several bad arguments names the same one;
// tests/torch/test_argument_errors.py compares the two backends call by call. Each returns when it
// finds nothing wrong, and the caller then hands over what is left (docs/torch_backend.md, "What
// stays on the Python path").
//
// They are called only where a call was declined, right before the hand-over: a call the backend runs
// never reaches them (no work on the hit path), and a declined one raises before anything is sent or
// enqueued. They read tensors' metadata alone, so CPU and CUDA tensors (declined by the device entry
// and the staging builders alike) take the same checks.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>
#include <vector>

#include <ATen/ATen.h>

namespace commlib {
namespace torch_backend {

// The Python side's name of torch's op (staging.py's _OPS), as its messages print it; null for one it
// does not name (reductions.cc prints "unsupported" then).
const char* op_name(c10d::ReduceOp::RedOpType op);

// all_reduce or reduce (`rooted`) of one tensor: an op its dtype does not define (bool, complex:
// staging.py's reduction_staging), then (reduce) a root out of range, then a bitwise op on floats
// (call_checks.py's check_op: "op: bitwise reduction 'band' is defined for integer dtypes only, not
// float32"). Sparse tensors are not checked here (several.cc).
void refuse_reduction(const at::Tensor& t, const c10d::ReduceOp& op, bool rooted = false, int64_t root = 0, int P = 0);
// A root out of range (broadcast, gather, scatter): "root: 5 is out of range for a communicator of size 4".
void refuse_root(int64_t root, int P);
// all_gather_into_tensor: the output's dtype (TypeError naming output_tensor), then its size.
void refuse_allgather_base(const at::Tensor& out, const at::Tensor& in, int P);
// reduce_scatter_tensor: the output's dtype against the input's (TypeError naming output), the input's
// size (naming input), then the op (refuse_reduction's checks, on the output).
void refuse_reduce_scatter_base(const at::Tensor& out, const at::Tensor& in, const c10d::ReduceOp& op, int P);
// all_to_all_single: the dtypes differ (TypeError naming output), then a side without split sizes
// (`out_equal`, `in_equal`) whose elements do not split over P ranks (output first).
void refuse_alltoall_base(const at::Tensor& out, const at::Tensor& in, bool out_equal, bool in_equal, int P);
// all_gather of one input into a list: one list per input, every tensor on one device (devices.py's
// check_one_device, here and in the list forms below), P tensors, of the input's dtype, this rank's
// of the input's size.
void refuse_allgather_list(const std::vector<std::vector<at::Tensor>>& out, const std::vector<at::Tensor>& in, int P,
                           int me);
// reduce_scatter of one output from a list: P inputs, this rank's of the output's size, a dtype the
// output has, then the op.
void refuse_reduce_scatter_list(const at::Tensor& out, const std::vector<at::Tensor>& in, const c10d::ReduceOp& op,
                                int P, int me);
// The list all_to_all: P tensors each way, one dtype.
void refuse_alltoall_list(const std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in, int P);
// gather and scatter: one tensor of this rank's (`mine`: gather's inputs, scatter's outputs), the root
// in range, and at the root P tensors in its list of `mine`'s size and dtype.
void refuse_rooted(bool gather, const std::vector<at::Tensor>& mine, const std::vector<std::vector<at::Tensor>>& lists,
                   int64_t root, int P, int me);
// allgather_coalesced: one output list per rank, one tensor per input in each, then each input's
// list as refuse_allgather_list checks it.
void refuse_allgather_coalesced(const std::vector<std::vector<at::Tensor>>& out, const std::vector<at::Tensor>& in,
                                int P, int me);
// reduce_scatter's lists: one output (as gloo), and one input list for it ("input_tensors: has 2 lists,
// expected one per output (1)"; zipped with the output, the other lists were once dropped unread).
void refuse_reduce_scatter_lists(const std::vector<at::Tensor>& out, const std::vector<std::vector<at::Tensor>>& in);
// The coalesced single-tensor forms: lists of two lengths ("output_tensors: has 3 tensors, expected one
// per input (2)"; zipped, the pairs past the shorter were once dropped unread), then each pair checked
// as the single call is, all of them before any is sent.
void refuse_pair_counts(const std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in);
void refuse_allgather_pairs(const std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in, int P);
void refuse_reduce_scatter_pairs(const std::vector<at::Tensor>& out, const std::vector<at::Tensor>& in,
                                 const c10d::ReduceOp& op, int P);
// allreduce_coalesced: every tensor's op, in order.
void refuse_reductions(const std::vector<at::Tensor>& t, const c10d::ReduceOp& op);

}  // namespace torch_backend
}  // namespace commlib
