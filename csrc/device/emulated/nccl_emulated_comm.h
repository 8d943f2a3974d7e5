// Internals of the emulated NCCL (device/emulated/nccl_emulated.h) shared by its files: the
// communicator's set-up (nccl_emulated_init.cc: unique id, rendezvous), its point-to-point groups
// and abort (nccl_emulated.cc), and the collectives built on them (nccl_emulated_coll.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/types.h"
#include "device/device.h"
#include "device/nccl_loader.h"

namespace commlib {
namespace emunccl {

// A communicator's region: one cache line per counter, kSlots slots of kChunk bytes per source.
constexpr size_t kLine = 64;
constexpr size_t kChunk = 64 << 10;
constexpr uint64_t kSlots = 4;

// One rank's communicator. Its region (a memfd the peers map) holds, per peer q, ready[q] (chunks
// q has put into this rank's slots) and freed[q] (chunks of this rank's messages q has consumed),
// one cache line each, then kSlots slots of kChunk bytes per source rank.
struct Comm {
  int rank = 0, size = 0;
  std::shared_ptr<Device> device;
  int fd = -1;
  size_t region_bytes = 0;
  std::vector<char*> regions;  // regions[rank] is this rank's own, the others mapped from peers
  std::atomic<bool> aborted{false};
  std::atomic<int> async_error{0};  // what CommGetAsyncError reports (set by a test's injection)
  std::atomic<int> pause_ms{0}, pauses{0};  // tests: emulated_nccl_pause_sweep (armed, made so far)
  // Chunk counters per peer; only the stream's host functions touch them, one group at a time.
  std::vector<uint64_t> sent, received;
  ~Comm();
};

// The opaque ncclComm_t handed out. Destroy frees it; Abort, which NCCL allows from another
// thread while a call is under way, only drops its reference to the communicator (atomically; the
// few bytes of the handle stay allocated so that such a call never reads freed memory). Host
// functions still queued on a stream keep the communicator alive through their own references.
struct Handle {
  std::shared_ptr<Comm> comm;  // read and reset only through std::atomic_load / atomic_store
};
inline Handle* handle(NcclComm c) { return reinterpret_cast<Handle*>(c); }
// The communicator behind `c`; null once it was aborted.
inline std::shared_ptr<Comm> comm_of(NcclComm c) { return c ? std::atomic_load(&handle(c)->comm) : nullptr; }

struct P2p {
  bool send;
  int peer;
  char* buf;
  size_t bytes;
};

// Enqueues `ops` on `stream` as one group (a host function progressing them together).
void enqueue_group(const std::shared_ptr<Comm>& comm, DeviceStream& stream, std::vector<P2p> ops);

// The unique id and CommInitRank (nccl_emulated_init.cc), with NCCL's signatures.
NcclResult get_unique_id(NcclUniqueId* id);
NcclResult comm_init_rank(NcclComm* out, int nranks, NcclUniqueId id, int rank);

// Records why the calling thread's call failed; returns `code`.
NcclResult fail(NcclResult code, const std::string& why);

// NCCL dtype / op codes to commlib's; false if the emulated NCCL does not have them.
bool to_dtype(int nccl, DType* out);
bool to_op(int nccl, RedOp* out);

// Collectives (nccl_emulated_coll.cc), with ncclAllReduce's etc. signatures.
NcclResult all_reduce(const void* in, void* out, size_t count, int dtype, int op, NcclComm c, void* stream);
NcclResult all_gather(const void* in, void* out, size_t count, int dtype, NcclComm c, void* stream);
NcclResult reduce_scatter(const void* in, void* out, size_t count, int dtype, int op, NcclComm c, void* stream);
NcclResult broadcast(const void* in, void* out, size_t count, int dtype, int root, NcclComm c, void* stream);
NcclResult reduce(const void* in, void* out, size_t count, int dtype, int op, int root, NcclComm c, void* stream);
// Collectives are refused inside a group (the double does not fuse them).
bool in_group();

}  // namespace emunccl
}  // namespace commlib
