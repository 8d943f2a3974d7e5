// The emulated NCCL's communicator: the unique id and rendezvous, point-to-point groups and
// abort (see device/emulated/nccl_emulated.h). The collectives are in nccl_emulated_coll.cc.
#include "device/emulated/nccl_emulated.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <random>
#include <thread>

#include "common/params.h"
#include "device/emulated/emulated_device.h"
#include "device/emulated/emulated_rules.h"
#include "device/host_flags.h"
#include "device/emulated/nccl_emulated_comm.h"

namespace commlib {
namespace emunccl {
namespace {

constexpr size_t kLine = 64;
constexpr size_t kChunk = 64 << 10;
constexpr uint64_t kSlots = 4;
constexpr int kMaxRanks = 4096;
// The nonce, then per rank {joined, pid, fd, device index, host hash}.
constexpr size_t kIdRegion = (1 + kMaxRanks) * kLine;

thread_local std::string t_error;
thread_local std::shared_ptr<Device> t_device;
thread_local double t_timeout_s = 300.0;

// The open group of the calling thread (GroupStart .. GroupEnd), as NCCL keeps it per thread.
struct Pending {
  std::shared_ptr<Comm> comm;
  DeviceStream* stream;
  P2p op;
};
thread_local int t_depth = 0;
thread_local std::vector<Pending> t_pending;

std::mutex g_ids_mu;
std::vector<int> g_id_fds;  // rendezvous regions this process created, closed once joined

uint64_t* ready(const Comm& c, char* region, int q) { return reinterpret_cast<uint64_t*>(region + q * kLine); }
uint64_t* freed(const Comm& c, char* region, int p) {
  return reinterpret_cast<uint64_t*>(region + (c.size + p) * kLine);
}
char* slot(const Comm& c, char* region, int src, uint64_t chunk) {
  return region + 2 * c.size * kLine + (src * kSlots + chunk % kSlots) * kChunk;
}

// This process's host as the emulated NCCL sees it (COMMLIB_HOST_ID, else the hostname), hashed.
uint64_t host_hash() {
  std::string host = param_string("COMMLIB_HOST_ID");
  if (host.empty()) {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    host = name;
  }
  return std::hash<std::string>{}(host) | 1;
}

// NCCL refuses a communicator with two ranks on one GPU ("Duplicate GPU detected"), on every
// rank, at ncclCommInitRank: the same here for two ranks on one emulated device of one host.
std::string duplicate_device(const char* id_region, int nranks) {
  for (int a = 0; a < nranks; ++a)
    for (int b = a + 1; b < nranks; ++b) {
      uint64_t da[2], db[2];
      std::memcpy(da, id_region + (1 + a) * kLine + 24, sizeof da);
      std::memcpy(db, id_region + (1 + b) * kLine + 24, sizeof db);
      if (da[0] == db[0] && da[1] == db[1])
        return "Duplicate GPU detected: rank " + std::to_string(a) + " and rank " + std::to_string(b) +
               " both on emulated:" + std::to_string(da[0]) +
               " of one host (NCCL needs one GPU per rank: give each rank its own device)";
    }
  return "";
}

char* map_fd(int fd, size_t bytes) {
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return m == MAP_FAILED ? nullptr : static_cast<char*>(m);
}

// Maps another process's memfd through /proc (as the emulated device imports memory).
char* map_peer(long pid, long fd, size_t bytes) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int f = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f < 0) return nullptr;
  struct stat st {};
  char* m = fstat(f, &st) == 0 && static_cast<size_t>(st.st_size) >= bytes ? map_fd(f, bytes) : nullptr;
  close(f);
  return m;
}

struct GroupOp {
  P2p op;
  uint64_t first = 0, n = 0, done = 0;
};

// Progresses every operation of a group until all are done or the communicator is aborted.
void run_group(Comm& c, std::vector<GroupOp>& ops) {
  char* mine = c.regions[c.rank];
  unsigned idle = 0;
  for (;;) {
    // An aborted communicator moves nothing more (NCCL frees it): its peers must not receive
    // the rest of a call whose data is garbage as if it were sound.
    if (c.aborted.load(std::memory_order_acquire)) return;
    bool progressed = false, left = false;
    for (GroupOp& g : ops) {
      const int p = g.op.peer;
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
      left |= g.done < g.n;
    }
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

NcclResult get_unique_id(NcclUniqueId* id) {
  int fd = memfd_create("commlib-emulated-nccl-id", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, kIdRegion) != 0) {
    if (fd >= 0) close(fd);
    return fail(kNcclSystemError, std::string("unique id: memfd: ") + std::strerror(errno));
  }
  std::random_device rd;
  const uint64_t nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 1;
  char* m = map_fd(fd, kIdRegion);
  if (!m) {
    close(fd);
    return fail(kNcclSystemError, "unique id: mmap failed");
  }
  std::memcpy(m, &nonce, sizeof nonce);
  munmap(m, kIdRegion);
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "commlib-emulated-nccl:%ld:%d:%016" PRIx64,
                static_cast<long>(getpid()), fd, nonce);
  std::lock_guard<std::mutex> lk(g_ids_mu);
  g_id_fds.push_back(fd);
  return kNcclSuccess;
}

// Waits until every rank has marked its slot of the rendezvous region, or the timeout passes.
bool wait_joined(char* id_region, int nranks, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int r = 0; r < nranks; ++r) {
    const uint64_t* joined = reinterpret_cast<uint64_t*>(id_region + (1 + r) * kLine);
    while (load_flag(joined) == 0) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  return true;
}

NcclResult comm_init_rank(NcclComm* out, int nranks, NcclUniqueId id, int rank) {
  if (const std::string v = emulated_host_function_violation("ncclCommInitRank"); !v.empty()) return fail(kNcclInvalidUsage, v);
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
    return fail(kNcclInvalidArgument, "CommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  if (!t_device) return fail(kNcclInvalidUsage, "CommInitRank: no device chosen (emulated_nccl_use_device)");
  long pid = 0;
  int idfd = -1;
  uint64_t nonce = 0;
  char tail = 0;
  id.internal[sizeof id.internal - 1] = 0;
  if (std::sscanf(id.internal, "commlib-emulated-nccl:%ld:%d:%16" SCNx64 "%c", &pid, &idfd, &nonce, &tail) != 3)
    return fail(kNcclInvalidArgument, "CommInitRank: not an emulated NCCL unique id");
  char* idr = map_peer(pid, idfd, kIdRegion);
  uint64_t stored = 0;
  if (idr) std::memcpy(&stored, idr, sizeof stored);
  if (!idr || stored != nonce) {
    if (idr) munmap(idr, kIdRegion);
    return fail(kNcclSystemError, "CommInitRank: the unique id's rendezvous (process " + std::to_string(pid) +
                                      ") is gone or is another one");
  }
  auto c = std::make_shared<Comm>();
  c->rank = rank;
  c->size = nranks;
  c->device = t_device;
  c->sent.assign(nranks, 0);
  c->received.assign(nranks, 0);
  c->regions.assign(nranks, nullptr);
  c->region_bytes = 2 * nranks * kLine + static_cast<size_t>(nranks) * kSlots * kChunk;
  c->fd = memfd_create("commlib-emulated-nccl", MFD_CLOEXEC);
  if (c->fd < 0 || ftruncate(c->fd, static_cast<off_t>(c->region_bytes)) != 0 ||
      !(c->regions[rank] = map_fd(c->fd, c->region_bytes))) {
    munmap(idr, kIdRegion);
    return fail(kNcclSystemError, std::string("CommInitRank: region: ") + std::strerror(errno));
  }
  char* my_slot = idr + (1 + rank) * kLine;
  auto* emulated = dynamic_cast<EmulatedDevice*>(t_device.get());
  const uint64_t me[4] = {static_cast<uint64_t>(getpid()), static_cast<uint64_t>(c->fd),
                          static_cast<uint64_t>(emulated ? emulated->index() : 0), host_hash()};
  std::memcpy(my_slot + 8, me, sizeof me);
  store_flag(reinterpret_cast<uint64_t*>(my_slot), 1);
  const bool joined = wait_joined(idr, nranks, t_timeout_s);
  const std::string duplicate = joined ? duplicate_device(idr, nranks) : "";
  std::string missing;
  for (int r = 0; joined && duplicate.empty() && r < nranks; ++r) {
    if (r == rank) continue;
    uint64_t peer[2];
    std::memcpy(peer, idr + (1 + r) * kLine + 8, sizeof peer);
    if (!(c->regions[r] = map_peer(static_cast<long>(peer[0]), static_cast<long>(peer[1]), c->region_bytes)))
      missing += " " + std::to_string(r);
  }
  munmap(idr, kIdRegion);
  if (pid == getpid()) {  // every rank has joined (or gave up): the rendezvous is over
    std::lock_guard<std::mutex> lk(g_ids_mu);
    for (auto it = g_id_fds.begin(); it != g_id_fds.end(); ++it)
      if (*it == idfd) {
        close(idfd);
        g_id_fds.erase(it);
        break;
      }
  }
  if (!joined)
    return fail(kNcclSystemError, "CommInitRank: not every rank joined within " + std::to_string(t_timeout_s) + " s");
  if (!duplicate.empty()) return fail(kNcclInvalidUsage, "CommInitRank: " + duplicate);
  if (!missing.empty()) return fail(kNcclSystemError, "CommInitRank: cannot map the regions of ranks" + missing);
  *out = reinterpret_cast<NcclComm>(new Handle{std::move(c)});
  return kNcclSuccess;
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
    a.version = 0;
    a.path = "emulated NCCL (commlib's test double, device/emulated/nccl_emulated.h)";
    return a;
  }();
  return api;
}

void emulated_nccl_use_device(std::shared_ptr<Device> device, double timeout_s) {
  emunccl::t_device = std::move(device);
  emunccl::t_timeout_s = timeout_s;
}

std::string emulated_nccl_last_error() { return emunccl::t_error; }

void emulated_nccl_inject_async_error(NcclComm c, NcclResult code) {
  const std::shared_ptr<emunccl::Comm> comm = emunccl::comm_of(c);
  if (!comm) throw std::invalid_argument("emulated NCCL: no live communicator to inject an error into");
  comm->async_error.store(code, std::memory_order_release);
}

}  // namespace commlib
