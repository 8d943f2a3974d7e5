// Single-copy reads between ranks of one host (process_vm_readv, "cross-memory attach"): the probe
// that turns them on, the read itself and the rendezvous acknowledgements (shm.h, link.h).
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "common/params.h"
#include "transport/shm/shm.h"
#include "transport/shm/shm_layout.h"

namespace commlib {

// Why process_vm_readv may be refused here, for the reason recorded with the failure.
static std::string ptrace_hint() {
  std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (f >> scope && scope > 0)
    return " (kernel.yama.ptrace_scope=" + std::to_string(scope) +
           ": only a parent may read its children's memory; 0 allows ranks of one user)";
  return "";
}

bool ShmTransport::enable_direct_reads() {
  // Probed unless COMMLIB_CMA=0; whether a call then uses single-copy reads is the sender's
  // choice per message (policy/single_copy.h: measured per collective, world size and size,
  // because on the 2-core VMs this project measures on they often lose to the pipelined copy
  // through cache-resident chunks: pinning the sender's pages costs about what the second copy
  // saves). A rank that can read every peer announces it; peers send it rendezvous chunks only then.
  if (param_string("COMMLIB_CMA") == "0") {
    direct_reads_reason_ = "COMMLIB_CMA=0";
    return false;
  }
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    uint64_t magic = 0;
    const pid_t pid = ctl(p).pid.load(std::memory_order_relaxed);
    struct iovec local = {&magic, sizeof(magic)};
    struct iovec remote = {reinterpret_cast<void*>(ctl(p).region_address.load(std::memory_order_relaxed)),
                           sizeof(magic)};
    const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n != static_cast<ssize_t>(sizeof(magic)) || magic != kMagic) {
      // e.g. ptrace restrictions, another user's process or a seccomp filter: keep the channels.
      const int err = errno;
      direct_reads_reason_ = "process_vm_readv of rank " + std::to_string(p) + " (pid " + std::to_string(pid) + ") " +
                             (n < 0 ? std::string("failed: ") + std::strerror(err) + (err == EPERM ? ptrace_hint() : "")
                                    : std::string("read the wrong bytes"));
      return false;
    }
  }
  direct_reads_ = true;
  direct_reads_reason_.clear();
  ctl(rank_).reads_directly.store(1, std::memory_order_release);
  return true;
}

void ShmLink::read_peer(void* dst, uint64_t remote, size_t bytes) {
  const pid_t pid = peer_ctl_.pid.load(std::memory_order_relaxed);
  char* out = static_cast<char*>(dst);
  while (bytes) {
    struct iovec local = {out, bytes};
    struct iovec rem = {reinterpret_cast<void*>(remote), bytes};
    ssize_t n = process_vm_readv(pid, &local, 1, &rem, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      throw PeerError("rank " + std::to_string(t_.rank_) + " could not read rank " + std::to_string(peer_) +
                      "'s buffer (process_vm_readv: " + std::strerror(n < 0 ? errno : EIO) + ")");
    }
    out += n;
    remote += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

void ShmLink::ack() {
  in_.acked.store(in_.acked.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  t_.ring(peer_);
}

uint64_t ShmLink::acked() { return out_.acked.load(std::memory_order_acquire); }

}  // namespace commlib
