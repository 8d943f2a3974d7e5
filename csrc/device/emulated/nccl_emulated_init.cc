// The emulated NCCL's communicator set-up: the unique id (a rendezvous memfd of the rank that
// called GetUniqueId) and CommInitRank, which joins it, checks NCCL's one-GPU-per-rank rule and
// maps every peer's region (see device/emulated/nccl_emulated.h). The point-to-point groups and
// abort are in nccl_emulated.cc, the collectives in nccl_emulated_coll.cc.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "common/params.h"
#include "device/emulated/emulated_device.h"
#include "device/emulated/emulated_rules.h"
#include "device/emulated/nccl_emulated.h"
#include "device/emulated/nccl_emulated_comm.h"
#include "device/host_flags.h"

namespace commlib {
namespace emunccl {
namespace {

constexpr int kMaxRanks = 4096;
// The nonce, then per rank {joined, pid, fd, device index, host hash}.
constexpr size_t kIdRegion = (1 + kMaxRanks) * kLine;

// The device (and set-up timeout) the calling thread's next CommInitRank binds to.
thread_local std::shared_ptr<Device> t_device;
thread_local double t_timeout_s = 300.0;

std::mutex g_ids_mu;
std::vector<int> g_id_fds;  // rendezvous regions this process created, closed once joined

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

}  // namespace

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

}  // namespace emunccl

void emulated_nccl_use_device(std::shared_ptr<Device> device, double timeout_s) {
  emunccl::t_device = std::move(device);
  emunccl::t_timeout_s = timeout_s;
}

}  // namespace commlib
