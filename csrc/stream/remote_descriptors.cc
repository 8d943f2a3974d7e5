// Call descriptors of peers on other hosts, exchanged in-band over NCCL (remote_descriptors.h).
#include "stream/remote_descriptors.h"

#include <sys/mman.h>

#include <cstring>
#include <stdexcept>

#include "plan/describe.h"

namespace commlib {

namespace {

constexpr size_t kSlot = 64;  // bytes per descriptor slot (a CallDesc, zero-padded)

}  // namespace

RemoteDescriptors::RemoteDescriptors(Device& device, NcclLink& nccl, CopyPath& copy, RemoteDescriptorsHost& host,
                                     const std::atomic<bool>& failed, int rank, int size)
    : device_(device), nccl_(nccl), copy_(copy), host_(host), failed_(failed), rank_(rank), size_(size) {}

void RemoteDescriptors::open() {
  bool any = false;
  for (int p = 0; p < size_; ++p) any = any || copy_.remote(p);
  if (!any) return;
  const size_t bytes = 2 * static_cast<size_t>(size_) * kSlot;
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::runtime_error("stream engine: descriptor staging: mmap failed");
  host_buf_ = static_cast<char*>(m);
  host_dev_ = device_.map_host(host_buf_, bytes);
  dev_ = device_.allocate(bytes);
}

void RemoteDescriptors::close(DeviceStream& s) {
  if (!host_buf_) return;
  device_.free_async(dev_, s);
  device_.synchronize(s);
  device_.unmap_host(host_buf_);
  munmap(host_buf_, 2 * static_cast<size_t>(size_) * kSlot);
  host_buf_ = nullptr;
  host_dev_ = nullptr;
  dev_ = nullptr;
}

void RemoteDescriptors::exchange(const std::vector<std::pair<int, CallDesc>>& sends,
                                 const std::vector<std::pair<int, CallDesc>>& expects, uint64_t seq, DeviceStream& s) {
  if (sends.empty() && expects.empty()) return;
  const size_t recv_at = static_cast<size_t>(size_) * kSlot;
  char* dev = static_cast<char*>(dev_);
  char* host_dev = reinterpret_cast<char*>(host_dev_);
  device_.host_func(
      [this, sends, expects] {
        host_.note_p2p_waits(expects, true);  // the watchdog looks for host messages of these numbers
        for (const auto& [peer, d] : sends) {
          char* slot = host_buf_ + static_cast<size_t>(peer) * kSlot;
          std::memset(slot, 0, kSlot);
          std::memcpy(slot, &d, sizeof d);
        }
      },
      s);
  std::vector<std::pair<int, const void*>> out;
  std::vector<std::pair<int, void*>> in;
  for (const auto& [peer, d] : sends) {
    const size_t off = static_cast<size_t>(peer) * kSlot;
    device_.copy(dev + off, host_dev + off, kSlot, s);
    out.emplace_back(peer, dev + off);
  }
  for (const auto& [peer, d] : expects) in.emplace_back(peer, dev + recv_at + static_cast<size_t>(peer) * kSlot);
  nccl_.enqueue_exchange(out, in, kSlot, s);
  for (const auto& [peer, d] : expects) {
    const size_t off = recv_at + static_cast<size_t>(peer) * kSlot;
    device_.copy(host_dev + off, dev + off, kSlot, s);
  }
  device_.host_func([this, expects, seq] { compare(expects, seq); }, s);
}

void RemoteDescriptors::compare(const std::vector<std::pair<int, CallDesc>>& expects, uint64_t seq) {
  host_.note_p2p_waits(expects, false);
  // After a failure NCCL was aborted and moved nothing: the slots hold stale bytes.
  if (failed_.load(std::memory_order_acquire)) return;
  const size_t recv_at = static_cast<size_t>(size_) * kSlot;
  const std::string me = std::to_string(rank_);
  for (const auto& [peer, want] : expects) {
    CallDesc got;
    std::memcpy(&got, host_buf_ + recv_at + static_cast<size_t>(peer) * kSlot, sizeof got);
    if (got == want) continue;
    const std::string them = std::to_string(peer);
    copy_.stop_data();  // this rank's own data steps skip (NCCL's group itself is released by the abort)
    const bool p2p = want.coll == static_cast<uint8_t>(Collective::Send);
    if (p2p)
      host_.fail_from_stream(ErrorKind::Mismatch, "rank " + me + " receives " + describe_call(want) + " from rank " + them +
                                    " (on another host) but rank " + them +
                                    (got.coll == want.coll ? " sent " : " called ") + describe_call(got), seq);
    else
      host_.fail_from_stream(ErrorKind::Mismatch, "rank " + me + " called " + describe_call(want) + " but rank " + them +
                                    " (on another host) called " + describe_call(got), seq);
    return;
  }
}

}  // namespace commlib
