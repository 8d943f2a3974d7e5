// Peers on other hosts (see stream_engine.h). Peer memory and the control regions need one
// machine (they are opened through /proc), so a peer on another host has neither: its messages go
// over the nccl link, and the call descriptors that a peer on this host finds in this rank's
// control region go to it in-band instead, as NCCL messages of their own before the call's data.
//
// Why in-band and not on the host control plane: the control plane carries one published call
// per rank (the latest; TCP sends only the newest), while the check needs this rank's descriptor
// for exactly this call number. A host call made right after an enqueued device call publishes a
// higher number before the stream reaches the device call, so the device call's descriptor would
// never be seen. NCCL delivers a pair's messages in order, so the k-th descriptor a rank receives
// from a peer is that peer's k-th call with it. The control plane still carries every device
// call too (publish_call_desc publishes it): a peer in a host call of the same number, or in a device
// call that does not talk to this rank, is found by the watchdog (stream_watchdog.cc).
//
// Per call: a host function writes this rank's descriptors into mapped host memory, the stream
// copies them to device memory (what NCCL sends from on a GPU), one NCCL group sends them and
// receives the peers', the stream copies those back and a host function compares. A mismatch
// fails the engine (MismatchError naming both calls), which aborts the NCCL communicator, so the
// call's data group that follows is released on every rank.
#include <sys/mman.h>

#include <cstring>

#include "stream/stream_engine.h"

namespace commlib {

namespace {

constexpr size_t kSlot = 64;  // bytes per descriptor slot (a CallDesc, zero-padded)

}  // namespace

void StreamEngine::open_remote_staging() {
  bool any = false;
  for (int p = 0; p < size_; ++p) any = any || remote(p);
  if (!any) return;
  const size_t bytes = 2 * static_cast<size_t>(size_) * kSlot;
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::runtime_error("stream engine: descriptor staging: mmap failed");
  remote_host_ = static_cast<char*>(m);
  remote_host_dev_ = device_->map_host(remote_host_, bytes);
  remote_dev_ = device_->allocate(bytes);
}

void StreamEngine::close_remote_staging() {
  if (!remote_host_) return;
  device_->free_async(remote_dev_, *own_stream_);
  device_->synchronize(*own_stream_);
  device_->unmap_host(remote_host_);
  munmap(remote_host_, 2 * static_cast<size_t>(size_) * kSlot);
  remote_host_ = nullptr;
  remote_host_dev_ = nullptr;
  remote_dev_ = nullptr;
}

int StreamEngine::mapped_peers() const { return copy_->mapped_peers(); }

std::vector<std::string> StreamEngine::link_names() const {
  std::vector<std::string> names(size_);
  for (int p = 0; p < size_; ++p)
    if (links_[p]) names[p] = links_[p]->name();
  return names;
}

void StreamEngine::exchange_remote(const std::vector<std::pair<int, CallDesc>>& sends,
                                   const std::vector<std::pair<int, CallDesc>>& expects, DeviceStream& s) {
  if (sends.empty() && expects.empty()) return;
  const size_t recv_at = static_cast<size_t>(size_) * kSlot;
  char* dev = static_cast<char*>(remote_dev_);
  char* host_dev = reinterpret_cast<char*>(remote_host_dev_);
  device_->host_func(
      [this, sends, expects] {
        note_p2p_waits(expects, true);  // the watchdog looks for host messages of these numbers
        for (const auto& [peer, d] : sends) {
          char* slot = remote_host_ + static_cast<size_t>(peer) * kSlot;
          std::memset(slot, 0, kSlot);
          std::memcpy(slot, &d, sizeof d);
        }
      },
      s);
  std::vector<std::pair<int, const void*>> out;
  std::vector<std::pair<int, void*>> in;
  for (const auto& [peer, d] : sends) {
    const size_t off = static_cast<size_t>(peer) * kSlot;
    device_->copy(dev + off, host_dev + off, kSlot, s);
    out.emplace_back(peer, dev + off);
  }
  for (const auto& [peer, d] : expects) in.emplace_back(peer, dev + recv_at + static_cast<size_t>(peer) * kSlot);
  nccl_->enqueue_exchange(out, in, kSlot, s);
  for (const auto& [peer, d] : expects) {
    const size_t off = recv_at + static_cast<size_t>(peer) * kSlot;
    device_->copy(host_dev + off, dev + off, kSlot, s);
  }
  device_->host_func([this, expects, seq = seq_] { compare_remote(expects, seq); }, s);
}

void StreamEngine::compare_remote(const std::vector<std::pair<int, CallDesc>>& expects, uint64_t seq) {
  note_p2p_waits(expects, false);
  // After a failure NCCL was aborted and moved nothing: the slots hold stale bytes.
  if (failed()) return;
  const size_t recv_at = static_cast<size_t>(size_) * kSlot;
  const std::string me = std::to_string(rank_);
  for (const auto& [peer, want] : expects) {
    CallDesc got;
    std::memcpy(&got, remote_host_ + recv_at + static_cast<size_t>(peer) * kSlot, sizeof got);
    if (got == want) continue;
    const std::string them = std::to_string(peer);
    copy_->stop_data();  // this rank's own data steps skip (NCCL's group itself is released by the abort)
    const bool p2p = want.coll == static_cast<uint8_t>(Collective::Send);
    if (p2p)
      fail_from_stream(ErrorKind::Mismatch, "rank " + me + " receives " + describe_call(want) + " from rank " + them +
                                    " (on another host) but rank " + them +
                                    (got.coll == want.coll ? " sent " : " called ") + describe_call(got), seq);
    else
      fail_from_stream(ErrorKind::Mismatch, "rank " + me + " called " + describe_call(want) + " but rank " + them +
                                    " (on another host) called " + describe_call(got), seq);
    return;
  }
}

}  // namespace commlib
