// Receive from any source (torch's recv without src, gloo's recvAnysource).
//
// Point-to-point messages carry their kind and per-pair sequence number in every chunk header, so
// the receiver can find a sender without its cooperation: it looks (without consuming) at the
// oldest unread chunk from each peer and takes the first peer whose next message is the send it
// expects, then receives that message as an ordinary recv. Runs as one FIFO call like every other,
// so nothing else touches the transport meanwhile.
#include <chrono>
#include <stdexcept>
#include <string>

#include "host/communicator.h"
#include "common/errors.h"

namespace commlib {

namespace {
using Clock = std::chrono::steady_clock;
}

int Communicator::wait_for_any_sender(DType dtype, int64_t count) {
  const auto start = Clock::now();
  auto last_slow_check = start;
  int first = 0;  // rotates so that one busy sender cannot starve the others
  for (;;) {
    const uint32_t seen = transport_->events();
    for (int i = 0; i < size_; ++i) {
      const int p = (first + i) % size_;
      if (p == rank_) continue;
      const char* payload = nullptr;
      const ChunkHeader* h = transport_->link(p).peek_recv(&payload);
      uint64_t next;
      {
        std::lock_guard<std::mutex> lk(p2p_mu_);
        next = recv_seq_[p] + 1;
      }
      if (h && h->desc.coll == static_cast<uint8_t>(Collective::Send) && h->desc.seq == next) {
        first = p + 1;
        return p;
      }
    }
    const auto now = Clock::now();
    const bool slow = now - last_slow_check > std::chrono::milliseconds(100);
    if (slow) last_slow_check = now;
    int open_peers = 0;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const PeerStatus st = transport_->peer_status(p, slow);
      if (st.state == PeerState::Failed)
        throw_kind(st.kind == ErrorKind::None ? ErrorKind::Comm : st.kind,
                   "rank " + std::to_string(rank_) + " in recv from any source: rank " + std::to_string(p) +
                       " failed: " + st.message);
      if (st.state == PeerState::Dead)
        throw PeerError(transport_->describe_peer(p) + " died while rank " + std::to_string(rank_) +
                        " was waiting to receive from any source");
      if (st.state != PeerState::Closed) ++open_peers;
    }
    if (open_peers == 0)
      throw PeerError("every other rank closed the communicator while rank " + std::to_string(rank_) +
                      " was waiting to receive from any source");
    const double waited = std::chrono::duration<double>(now - start).count();
    if (waited > exec_.timeout_s())
      throw PeerError("no rank sent to rank " + std::to_string(rank_) + " within " + exec_.timeout_owner() + " (" +
                      std::to_string(exec_.timeout_s()) + " s) during recv from any source (" +
                      std::to_string(count) + " x " + dtype_name(dtype) + ")");
    transport_->wait_events(seen, 10000);
  }
}

std::shared_ptr<Work> Communicator::recv_any(uintptr_t ptr, int64_t count, DType dtype, int32_t* source, bool async,
                                             double timeout_s) {
  if (count < 0) throw std::invalid_argument("count: negative");
  if (size_ < 2) throw std::invalid_argument("recv from any source: the communicator has no other rank");
  if (source == nullptr) throw std::invalid_argument("source: null");
  {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    ++queued_any_;  // receives submitted behind it number when they run (Communicator::p2p)
  }
  return submit_function(
      [this, ptr, count, dtype, source, timeout_s] {
        CallTimeout call_timeout(exec_, timeout_s);
        auto ran = [this] {
          std::lock_guard<std::mutex> lk(p2p_mu_);
          --queued_any_;
        };
        int src = -1;
        try {
          throw_if_aborted();
          src = wait_for_any_sender(dtype, count);
        } catch (const CommError& e) {
          ran();
          fail_communicator(e);
          throw;
        } catch (...) {
          ran();
          throw;
        }
        *source = src;
        const uint64_t seq = next_p2p_seq(src, false);
        ran();
        run_p2p({P2PItem{false, ptr, count, src}}, dtype, {seq});
      },
      async);
}

}  // namespace commlib
