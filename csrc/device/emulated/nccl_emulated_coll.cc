// The emulated NCCL's collectives (see device/emulated/nccl_emulated.h): each is one group of sends and
// receives on the stream, then copies and reductions with the device's shared functors, reducing
// the ranks' contributions in rank order so that every rank computes the same bits.
#include "device/emulated/emulated_rules.h"
#include <cstring>

#include "device/emulated/nccl_emulated_comm.h"

namespace commlib {
namespace emunccl {
namespace {

struct Args {
  std::shared_ptr<Comm> comm;
  DeviceStream* stream;
  DType dtype;
  RedOp op;
  size_t bytes;  // of one rank's block
};

// Checks what every collective shares; `op < 0`: the collective does not reduce.
NcclResult check(const char* what, int dtype, int op, NcclComm c, void* stream, size_t count, Args* a) {
  if (const std::string v = emulated_host_function_violation(what); !v.empty()) return fail(kNcclInvalidUsage, v);
  if (in_group()) return fail(kNcclInvalidUsage, std::string(what) + " inside a group is not modelled");
  if (!to_dtype(dtype, &a->dtype)) return fail(kNcclInvalidArgument, std::string(what) + ": unsupported datatype");
  a->op = RedOp::Sum;
  if (op >= 0 && !to_op(op, &a->op)) return fail(kNcclInvalidArgument, std::string(what) + ": unsupported op");
  if (!c || !stream) return fail(kNcclInvalidArgument, std::string(what) + ": null communicator or stream");
  a->comm = comm_of(c);
  if (!a->comm) return fail(kNcclInvalidUsage, std::string(what) + ": the communicator was aborted");
  a->stream = static_cast<DeviceStream*>(stream);
  a->bytes = count * dtype_size(a->dtype);
  return kNcclSuccess;
}

// out = blocks[0] op blocks[1] op ... (rank order), blocks being `size` consecutive blocks.
void reduce_blocks(const Args& a, char* out, const char* blocks) {
  Device& d = *a.comm->device;
  d.copy(out, blocks, a.bytes, *a.stream);
  for (int q = 1; q < a.comm->size; ++q)
    d.reduce(out, blocks + q * a.bytes, a.bytes / dtype_size(a.dtype), a.dtype, a.op, *a.stream);
}

// Every rank's `in + offset(q)` goes to rank q; rank q's block for this rank lands in
// blocks + q * bytes (this rank's own copied locally); then the blocks are reduced into `out`.
void exchange_and_reduce(const Args& a, const char* in, size_t (*offset)(const Args&, int), char* out,
                         bool to_root_only, int root) {
  Device& d = *a.comm->device;
  const int me = a.comm->rank, n = a.comm->size;
  const bool receives = !to_root_only || me == root;
  // Stream-ordered: NCCL never frees (or cudaFrees) inside a call.
  char* blocks = receives ? static_cast<char*>(d.allocate_ordered(n * a.bytes, *a.stream)) : nullptr;
  if (receives) d.copy(blocks + me * a.bytes, in + offset(a, me), a.bytes, *a.stream);
  std::vector<P2p> ops;
  for (int q = 0; q < n; ++q) {
    if (q == me) continue;
    if (!to_root_only || q == root) ops.push_back(P2p{true, q, const_cast<char*>(in) + offset(a, q), a.bytes});
    if (receives) ops.push_back(P2p{false, q, blocks + q * a.bytes, a.bytes});
  }
  enqueue_group(a.comm, *a.stream, std::move(ops));
  if (receives) {
    reduce_blocks(a, out, blocks);
    d.free_ordered(blocks, *a.stream);
  }
}

size_t whole(const Args&, int) { return 0; }
size_t block_of(const Args& a, int q) { return q * a.bytes; }

}  // namespace

NcclResult all_reduce(const void* in, void* out, size_t count, int dtype, int op, NcclComm c, void* stream) {
  Args a;
  if (NcclResult r = check("AllReduce", dtype, op, c, stream, count, &a)) return r;
  if (!count) return kNcclSuccess;
  exchange_and_reduce(a, static_cast<const char*>(in), whole, static_cast<char*>(out), false, 0);
  return kNcclSuccess;
}

NcclResult reduce(const void* in, void* out, size_t count, int dtype, int op, int root, NcclComm c, void* stream) {
  Args a;
  if (NcclResult r = check("Reduce", dtype, op, c, stream, count, &a)) return r;
  if (root < 0 || root >= a.comm->size) return fail(kNcclInvalidArgument, "Reduce: root out of range");
  if (!count) return kNcclSuccess;
  exchange_and_reduce(a, static_cast<const char*>(in), whole, static_cast<char*>(out), true, root);
  return kNcclSuccess;
}

NcclResult reduce_scatter(const void* in, void* out, size_t count, int dtype, int op, NcclComm c, void* stream) {
  Args a;
  if (NcclResult r = check("ReduceScatter", dtype, op, c, stream, count, &a)) return r;
  if (!count) return kNcclSuccess;
  exchange_and_reduce(a, static_cast<const char*>(in), block_of, static_cast<char*>(out), false, 0);
  return kNcclSuccess;
}

NcclResult all_gather(const void* in, void* out, size_t count, int dtype, NcclComm c, void* stream) {
  Args a;
  if (NcclResult r = check("AllGather", dtype, -1, c, stream, count, &a)) return r;
  if (!count) return kNcclSuccess;
  const int me = a.comm->rank;
  char* o = static_cast<char*>(out);
  if (o + me * a.bytes != in) a.comm->device->copy(o + me * a.bytes, in, a.bytes, *a.stream);
  std::vector<P2p> ops;
  for (int q = 0; q < a.comm->size; ++q) {
    if (q == me) continue;
    ops.push_back(P2p{true, q, const_cast<char*>(static_cast<const char*>(in)), a.bytes});
    ops.push_back(P2p{false, q, o + q * a.bytes, a.bytes});
  }
  enqueue_group(a.comm, *a.stream, std::move(ops));
  return kNcclSuccess;
}

NcclResult broadcast(const void* in, void* out, size_t count, int dtype, int root, NcclComm c, void* stream) {
  Args a;
  if (NcclResult r = check("Broadcast", dtype, -1, c, stream, count, &a)) return r;
  if (root < 0 || root >= a.comm->size) return fail(kNcclInvalidArgument, "Broadcast: root out of range");
  if (!count) return kNcclSuccess;
  std::vector<P2p> ops;
  if (a.comm->rank == root) {
    if (in != out) a.comm->device->copy(out, in, a.bytes, *a.stream);
    for (int q = 0; q < a.comm->size; ++q)
      if (q != root) ops.push_back(P2p{true, q, const_cast<char*>(static_cast<const char*>(in)), a.bytes});
  } else {
    ops.push_back(P2p{false, root, static_cast<char*>(out), a.bytes});
  }
  enqueue_group(a.comm, *a.stream, std::move(ops));
  return kNcclSuccess;
}

}  // namespace emunccl
}  // namespace commlib
