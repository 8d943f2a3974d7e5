// The emulated NCCL's communicator: point-to-point groups, abort and the API table (see
// device/emulated/nccl_emulated.h). Its set-up (unique id, rendezvous) is in
// nccl_emulated_init.cc, the collectives in nccl_emulated_coll.cc.
#include "device/emulated/nccl_emulated.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "device/emulated/emulated_device.h"
#include "device/emulated/emulated_rules.h"
#include "device/host_flags.h"
#include "device/emulated/nccl_emulated_comm.h"

namespace commlib {
namespace emunccl {
namespace {

thread_local std::string t_error;

// The open group of the calling thread (GroupStart .. GroupEnd), as NCCL keeps it per thread.
struct Pending {
  std::shared_ptr<Comm> comm;
  DeviceStream* stream;
  P2p op;
};
thread_local int t_depth = 0;
thread_local std::vector<Pending> t_pending;

uint64_t* ready(const Comm& c, char* region, int q) { return reinterpret_cast<uint64_t*>(region + q * kLine); }
uint64_t* freed(const Comm& c, char* region, int p) {
  return reinterpret_cast<uint64_t*>(region + (c.size + p) * kLine);
}
char* slot(const Comm& c, char* region, int src, uint64_t chunk) {
  return region + 2 * c.size * kLine + (src * kSlots + chunk % kSlots) * kChunk;
}

struct GroupOp {
  P2p op;
  uint64_t first = 0, n = 0, done = 0;
};

// Whether a send after `g` in `ops` goes to g's peer.
bool later_send(const std::vector<GroupOp>& ops, const GroupOp& g) {
  for (const GroupOp* o = &g + 1; o < ops.data() + ops.size(); ++o)
    if (o->op.send && o->op.peer == g.op.peer) return true;
  return false;
}

// Progresses every operation of a group until all are done or the communicator is aborted.
// A group's operations to one peer in one direction hold consecutive chunk numbers in call order
// (enqueue_group), and each moves only once every earlier one of its (peer, direction) is done:
// chunks move strictly in order per ordered pair, as NCCL matches them. (Without that hold, a
// send whose slot was still in use could be passed, in the same sweep, by the next send to that
// peer once the receiver had freed a slot meanwhile: `ready` then counted a chunk never written,
// and the receiver took a stale slot; a receive likewise could free a later slot before an
// earlier one was read, and the sender overwrote it. A group has several messages to one peer
// where a device list merges lanes' steps: rail_window's merged rounds across hosts, session 30.)
void run_group(Comm& c, std::vector<GroupOp>& ops) {
  char* mine = c.regions[c.rank];
  unsigned idle = 0;
  std::vector<char> held(2 * static_cast<size_t>(c.size));  // per (peer, direction): an earlier op still moving
  int pause_at_end = 0;  // tests: the sweep's pause (emulated_nccl_pause_sweep)
  for (;;) {
    // An aborted communicator moves nothing more (NCCL frees it): its peers must not receive
    // the rest of a call whose data is garbage as if it were sound.
    if (c.aborted.load(std::memory_order_acquire)) return;
    bool progressed = false, left = false;
    std::fill(held.begin(), held.end(), 0);
    for (GroupOp& g : ops) {
      const int p = g.op.peer;
      char& earlier = held[2 * static_cast<size_t>(p) + (g.op.send ? 1 : 0)];
      if (earlier) {  // an earlier chunk to / from p has not moved yet: this op waits its turn
        left = true;
        continue;
      }
      while (g.done < g.n) {
        const uint64_t k = g.first + g.done;
        const size_t off = g.done * kChunk, n = std::min(kChunk, g.op.bytes - std::min(g.op.bytes, off));
        if (g.op.send) {
          if (k >= kSlots && load_flag(freed(c, mine, p)) < k + 1 - kSlots) break;  // slot still in use
          if (n) std::memcpy(slot(c, c.regions[p], c.rank, k), g.op.buf + off, n);
          store_flag(ready(c, c.regions[p], c.rank), k + 1);
        } else {
          if (load_flag(ready(c, mine, p)) < k + 1) break;  // not sent yet
          if (n) std::memcpy(g.op.buf + off, slot(c, mine, p, k), n);
          store_flag(freed(c, c.regions[p], c.rank), k + 1);
        }
        ++g.done;
        progressed = true;
      }
      if (g.done < g.n) {
        left = true, earlier = 1;
        if (g.op.send && !pause_at_end && c.pause_ms.load(std::memory_order_relaxed) > 0 && later_send(ops, g)) {
          pause_at_end = c.pause_ms.exchange(0);  // (one sweep; emulated_nccl_pause_sweep)
          if (pause_at_end > 0) {
            c.pauses.fetch_add(1);
            std::this_thread::sleep_for(std::chrono::milliseconds(pause_at_end));
          }
        }
      }
    }
    if (pause_at_end > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_at_end));
    pause_at_end = 0;
    if (!left) return;
    if (progressed) {
      idle = 0;
    } else if (++idle < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(idle < 1024 ? 20 : 200));
    }
  }
}

}  // namespace

Comm::~Comm() {
  for (char* r : regions)
    if (r) munmap(r, region_bytes);
  if (fd >= 0) close(fd);
}

NcclResult fail(NcclResult code, const std::string& why) {
  t_error = "emulated NCCL: " + why;
  return code;
}

bool in_group() { return t_depth > 0; }

bool to_dtype(int nccl, DType* out) {
  switch (nccl) {
    case kNcclInt8: *out = DType::Int8; return true;
    case kNcclUint8: *out = DType::UInt8; return true;
    case kNcclInt32: *out = DType::Int32; return true;
    case kNcclInt64: *out = DType::Int64; return true;
    case kNcclFloat16: *out = DType::Float16; return true;
    case kNcclFloat32: *out = DType::Float32; return true;
    case kNcclFloat64: *out = DType::Float64; return true;
    case kNcclBfloat16: *out = DType::BFloat16; return true;
    default: return false;
  }
}

bool to_op(int nccl, RedOp* out) {
  switch (nccl) {
    case kNcclSum: *out = RedOp::Sum; return true;
    case kNcclProd: *out = RedOp::Prod; return true;
    case kNcclMax: *out = RedOp::Max; return true;
    case kNcclMin: *out = RedOp::Min; return true;
    default: return false;  // ncclAvg and PreMulSum: not modelled (the engine never passes them)
  }
}

void enqueue_group(const std::shared_ptr<Comm>& comm, DeviceStream& stream, std::vector<P2p> ops) {
  if (ops.empty()) return;
  // Chunk numbers are given in call order per ordered pair: that is the in-order matching.
  std::vector<GroupOp> group;
  for (const P2p& o : ops) group.push_back(GroupOp{o, 0, o.bytes ? (o.bytes + kChunk - 1) / kChunk : 1, 0});
  std::shared_ptr<Comm> keep = comm;
  // NCCL's work is a kernel: it waits for its peers on the stream, never on the host-function
  // thread (where it would block every other stream's host functions).
  auto* emulated = dynamic_cast<EmulatedDevice*>(comm->device.get());
  auto launch = [&](std::function<void()> fn) {
    if (emulated)
      emulated->launch_host_kernel(std::move(fn), stream);
    else
      comm->device->host_func(std::move(fn), stream);
  };
  launch(
      [keep, group]() mutable {
        Comm& c = *keep;
        for (GroupOp& g : group) {
          uint64_t& counter = g.op.send ? c.sent[g.op.peer] : c.received[g.op.peer];
          g.first = counter;
          counter += g.n;
        }
        run_group(c, group);
      });
}

namespace {

NcclResult get_version(int* v) {
  *v = 0;  // not an NCCL release
  return kNcclSuccess;
}

const char* error_string(NcclResult r) {
  switch (r) {
    case kNcclSuccess: return "no error";
    case kNcclSystemError: return "unhandled system error";
    case kNcclInternalError: return "internal error";
    case kNcclInvalidArgument: return "invalid argument";
    case kNcclInvalidUsage: return "invalid usage";
    case kNcclRemoteError: return "remote process exited or there was a network error";
    default: return "unknown result code";
  }
}

NcclResult comm_destroy(NcclComm c) {
  if (const std::string v = emulated_host_function_violation("ncclCommDestroy"); !v.empty()) return fail(kNcclInvalidUsage, v);
  delete handle(c);
  return kNcclSuccess;
}

NcclResult comm_abort(NcclComm c) {
  if (const std::string v = emulated_host_function_violation("ncclCommAbort"); !v.empty()) return fail(kNcclInvalidUsage, v);
  if (!c) return fail(kNcclInvalidArgument, "CommAbort: null communicator");
  std::shared_ptr<Comm> comm = std::atomic_exchange(&handle(c)->comm, std::shared_ptr<Comm>());
  if (comm) comm->aborted.store(true, std::memory_order_release);  // a group in progress returns
  return kNcclSuccess;
}

NcclResult comm_get_async_error(NcclComm c, NcclResult* out) {
  if (!c || !out) return fail(kNcclInvalidArgument, "CommGetAsyncError: null argument");
  const std::shared_ptr<Comm> comm = comm_of(c);
  *out = comm ? comm->async_error.load(std::memory_order_acquire) : kNcclSuccess;
  return kNcclSuccess;
}

NcclResult p2p(bool send, const void* buf, size_t count, int dtype, int peer, NcclComm c, void* stream) {
  DType t;
  if (!to_dtype(dtype, &t)) return fail(kNcclInvalidArgument, "unsupported datatype " + std::to_string(dtype));
  const std::shared_ptr<Comm> comm = comm_of(c);
  if (!comm) return fail(kNcclInvalidUsage, "the communicator was aborted");
  if (peer < 0 || peer >= comm->size || peer == comm->rank)
    return fail(kNcclInvalidArgument, "peer " + std::to_string(peer) + " of rank " + std::to_string(comm->rank));
  P2p op{send, peer, static_cast<char*>(const_cast<void*>(buf)), count * dtype_size(t)};
  auto* s = static_cast<DeviceStream*>(stream);
  if (t_depth > 0) {
    t_pending.push_back(Pending{comm, s, op});
  } else {
    enqueue_group(comm, *s, {op});
  }
  return kNcclSuccess;
}

NcclResult send(const void* buf, size_t count, int dtype, int peer, NcclComm c, void* stream) {
  return p2p(true, buf, count, dtype, peer, c, stream);
}
NcclResult recv(void* buf, size_t count, int dtype, int peer, NcclComm c, void* stream) {
  return p2p(false, buf, count, dtype, peer, c, stream);
}

NcclResult group_start() {
  ++t_depth;
  return kNcclSuccess;
}

NcclResult group_end() {
  if (const std::string v = emulated_host_function_violation("ncclGroupEnd"); !v.empty()) return fail(kNcclInvalidUsage, v);
  if (t_depth == 0) return fail(kNcclInvalidUsage, "GroupEnd without GroupStart");
  if (--t_depth > 0) return kNcclSuccess;
  // One group per (communicator, stream), in the order first used.
  std::vector<Pending> pending;
  pending.swap(t_pending);
  std::vector<bool> taken(pending.size(), false);
  for (size_t i = 0; i < pending.size(); ++i) {
    if (taken[i]) continue;
    std::vector<P2p> ops;
    for (size_t j = i; j < pending.size(); ++j)
      if (!taken[j] && pending[j].comm == pending[i].comm && pending[j].stream == pending[i].stream) {
        ops.push_back(pending[j].op);
        taken[j] = true;
      }
    enqueue_group(pending[i].comm, *pending[i].stream, std::move(ops));
  }
  return kNcclSuccess;
}

}  // namespace
}  // namespace emunccl

const NcclApi& emulated_nccl_api() {
  static const NcclApi api = [] {
    NcclApi a;
    a.GetVersion = emunccl::get_version;
    a.GetErrorString = emunccl::error_string;
    a.GetUniqueId = emunccl::get_unique_id;
    a.CommInitRank = emunccl::comm_init_rank;
    a.CommDestroy = emunccl::comm_destroy;
    a.CommAbort = emunccl::comm_abort;
    a.CommGetAsyncError = emunccl::comm_get_async_error;
    a.AllReduce = emunccl::all_reduce;
    a.AllGather = emunccl::all_gather;
    a.ReduceScatter = emunccl::reduce_scatter;
    a.Broadcast = emunccl::broadcast;
    a.Reduce = emunccl::reduce;
    a.Send = emunccl::send;
    a.Recv = emunccl::recv;
    a.GroupStart = emunccl::group_start;
    a.GroupEnd = emunccl::group_end;
    a.UseDevice = emulated_nccl_use_device;
    a.LastError = emulated_nccl_last_error;
    a.version = 0;
    a.path = "emulated NCCL (commlib's test double, device/emulated/nccl_emulated.h)";
    return a;
  }();
  return api;
}

std::string emulated_nccl_last_error() { return emunccl::t_error; }

int emulated_nccl_pause_sweep(const NcclApi& api, NcclComm c, int ms) {
  if (&api != &emulated_nccl_api())
    throw std::invalid_argument("pause_sweep: only the emulated NCCL pauses its sweeps");
  if (!c) throw std::invalid_argument("pause_sweep: no NCCL communicator");
  if (ms < 0) throw std::invalid_argument("pause_sweep: ms must be >= 0, got " + std::to_string(ms));
  const std::shared_ptr<emunccl::Comm> comm = emunccl::comm_of(c);
  if (!comm) throw std::invalid_argument("emulated NCCL: no live communicator to pause");
  if (ms) comm->pause_ms.store(ms);
  return comm->pauses.load();
}

void emulated_nccl_inject_async_error(const NcclApi& api, NcclComm c, NcclResult code) {
  if (&api != &emulated_nccl_api())
    throw std::invalid_argument("inject_async_error: only the emulated NCCL takes injected errors");
  if (!c) throw std::invalid_argument("inject_async_error: no NCCL communicator");
  const std::shared_ptr<emunccl::Comm> comm = emunccl::comm_of(c);
  if (!comm) throw std::invalid_argument("emulated NCCL: no live communicator to inject an error into");
  comm->async_error.store(code, std::memory_order_release);
}

}  // namespace commlib
