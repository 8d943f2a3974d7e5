// The TCP transport's progress thread: epoll over the listening socket, the handshakes in
// progress, every peer connection and an eventfd the callers poke. It parses incoming frames into
// the receive rings, finishes blocked sends, vets new connections, and sends this rank's call.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/types.h"
#include "transport/tcp_conn.h"

namespace commlib {

namespace {
constexpr uint64_t kTagListen = 1ull << 56, kTagEvent = 2ull << 56, kTagConn = 3ull << 56, kTagPending = 4ull << 56;
constexpr uint64_t kTagMask = 0xffull << 56;
constexpr size_t kMaxPending = 16;
char g_discard[1 << 16];  // where a closing rank drops the payloads it no longer wants

bool valid_desc(const CallDesc& d) {
  return d.coll < static_cast<uint8_t>(Collective::kCount) && d.dtype < static_cast<uint8_t>(DType::kCount) &&
         d.op < static_cast<uint8_t>(RedOp::kCount) && d.count >= 0;
}
}  // namespace

void TcpTransport::progress_loop() {
  epoll_event evs[64];
  double next_call = monotonic_s();
  while (!stop_.load()) {
    int n = epoll_wait(epoll_fd_, evs, 64, 50);
    for (int i = 0; i < n; ++i) {
      const uint64_t tag = evs[i].data.u64 & kTagMask, index = evs[i].data.u64 & ~kTagMask;
      if (tag == kTagListen) {
        accept_new();
      } else if (tag == kTagEvent) {
        uint64_t v;
        (void)!read(event_fd_, &v, sizeof(v));
        for (auto& c : conns_) {
          if (!c || c->fd.load() < 0) continue;
          if (c->rx_stalled.load() && (draining_.load() || c->recv_tail.load() - c->recv_head.load() < cfg_.nslots)) {
            c->rx_stalled.store(false);
            on_readable(*c);
          }
          if (c->fd.load() >= 0) update_interest(*c);
        }
      } else if (tag == kTagPending) {
        for (auto& p : pending_)
          if (p && static_cast<uint64_t>(p->fd) == index) {
            advance_pending(*p);
            break;
          }
        pending_.erase(std::remove(pending_.begin(), pending_.end(), nullptr), pending_.end());
      } else if (tag == kTagConn) {
        Conn& c = *conns_[index];
        if (c.fd.load() < 0) continue;
        if (evs[i].events & EPOLLOUT) {
          std::lock_guard<std::mutex> g(c.send_mu);
          if (flush(c)) c.want_write.store(false);
        }
        if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) on_readable(c);
        if (c.fd.load() >= 0) update_interest(c);
      }
    }
    const double now = monotonic_s();
    if (now >= next_call) {
      next_call = now + 0.05;
      send_calls();
      for (auto& p : pending_)
        if (p && now > p->deadline) drop_pending(*p, "handshake not completed in time");
      pending_.erase(std::remove(pending_.begin(), pending_.end(), nullptr), pending_.end());
    }
  }
}

void TcpTransport::update_interest(Conn& c) {
  uint32_t want = (c.rx_stalled.load() ? 0u : static_cast<uint32_t>(EPOLLIN)) |
                  (c.want_write.load() ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  if (want == c.interest) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = kTagConn | static_cast<uint64_t>(c.peer);
  // Nothing wanted: leave epoll altogether, or an end of stream (always reported) would spin us.
  const int how = want == 0 ? EPOLL_CTL_DEL : c.interest == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
  epoll_ctl(epoll_fd_, how, c.fd.load(), &ev);
  c.interest = want;
}

void TcpTransport::drop_conn(Conn& c) {
  int fd;
  {
    std::lock_guard<std::mutex> g(c.send_mu);
    fd = c.fd.exchange(-1);
    c.shut_write = true;
  }
  if (fd >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
  }
  wake();
}

void TcpTransport::protocol_error(Conn& c, const std::string& what) {
  log_warn("dropped the connection from rank " + std::to_string(c.peer) + ": " + what);
  mark_down(c, PeerState::Failed, "rank " + std::to_string(c.peer) + " sent an invalid frame (" + what + ")");
  drop_conn(c);
}

void TcpTransport::on_readable(Conn& c) {
  const size_t stride = c.recv_ring.size() / cfg_.nslots;
  for (;;) {
    const int fd = c.fd.load();
    if (fd < 0) return;
    char* dst;
    size_t want;
    if (!c.in_body) {
      dst = reinterpret_cast<char*>(&c.hdr) + c.hdr_got;
      want = sizeof(WireHeader) - c.hdr_got;
    } else if (c.hdr.type == kFrameData) {
      if (draining_.load()) {
        dst = g_discard;
        want = std::min(sizeof(g_discard), c.hdr.length - c.body_got);
      } else {
        // Only into a free slot: an end of stream or error wakes this thread even while the ring
        // is full, and the slot at tail is then the oldest unread chunk.
        if (c.body_got == 0 && !ring_has_space(c)) return;
        dst = c.recv_slot(c.recv_tail.load(std::memory_order_relaxed), stride, cfg_.nslots) + c.body_got;
        // The chunk header first, alone, so it is checked before the payload lands behind it.
        want = c.body_got < sizeof(ChunkHeader) ? sizeof(ChunkHeader) - c.body_got : c.hdr.length - c.body_got;
      }
    } else {
      dst = &c.control_in[c.body_got];
      want = c.hdr.length - c.body_got;
    }
    ssize_t n = want ? recv(fd, dst, want, MSG_DONTWAIT) : 0;
    if (want && n == 0) {
      bool closed = false;
      {
        std::lock_guard<std::mutex> g(c.state_mu);
        closed = c.got_close;
      }
      if (!closed) mark_down(c, PeerState::Dead, "connection lost (end of stream without a close)");
      drop_conn(c);
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      mark_down(c, PeerState::Dead, std::string("connection lost (") + std::strerror(errno) + ")");
      drop_conn(c);
      return;
    }
    if (!c.in_body) {
      c.hdr_got += static_cast<size_t>(n);
      if (c.hdr_got < sizeof(WireHeader)) continue;
      if (!handle_frame_header(c)) return;
      continue;
    }
    const size_t before = c.body_got;
    c.body_got += static_cast<size_t>(n);
    if (c.hdr.type == kFrameData && !draining_.load() && before < sizeof(ChunkHeader) &&
        c.body_got >= sizeof(ChunkHeader)) {
      const auto* h = reinterpret_cast<const ChunkHeader*>(
          c.recv_slot(c.recv_tail.load(std::memory_order_relaxed), stride, cfg_.nslots));
      if (h->bytes != c.hdr.length - sizeof(ChunkHeader) || h->flags != 0 || !valid_desc(h->desc) ||
          h->offset > (uint64_t{1} << 62)) {
        protocol_error(c, "impossible chunk header (" + std::to_string(h->bytes) + " bytes at offset " +
                              std::to_string(h->offset) + ", flags " + std::to_string(h->flags) + ")");
        return;
      }
    }
    if (c.body_got < c.hdr.length) continue;
    // A whole frame.
    c.in_body = false;
    c.hdr_got = 0;
    if (c.hdr.type == kFrameData) {
      if (!draining_.load()) {
        c.recv_tail.store(c.recv_tail.load(std::memory_order_relaxed) + 1, std::memory_order_release);
        wake();
      }
    } else {
      handle_control(c);
    }
  }
}

// Checks a complete WireHeader; returns false when reading must stop (bad frame or full ring).
bool TcpTransport::handle_frame_header(Conn& c) {
  const WireHeader& h = c.hdr;
  bool ok = h.magic == kFrameMagic && h.reserved == 0;
  switch (h.type) {
    case kFrameData: ok &= h.length >= sizeof(ChunkHeader) && h.length <= sizeof(ChunkHeader) + cfg_.chunk_bytes; break;
    case kFrameCall: ok &= h.length == sizeof(CallDesc); break;
    case kFrameFail: ok &= h.length >= 4 && h.length <= 4 + kMaxFailMessage; break;
    case kFrameClose: ok &= h.length == 0; break;
    default: ok = false;
  }
  if (!ok) {
    protocol_error(c, "impossible frame header (type " + std::to_string(h.type) + ", " + std::to_string(h.length) +
                          " bytes)");
    return false;
  }
  c.in_body = true;
  c.body_got = 0;
  if (h.type != kFrameData) {
    c.control_in.assign(h.length, '\0');
    if (h.length == 0) {
      c.in_body = false;
      c.hdr_got = 0;
      handle_control(c);
    }
    return true;
  }
  if (draining_.load()) return true;
  return ring_has_space(c);
}

// A data frame needs a free receive slot; without one, stop reading (and watching) the socket
// until the caller frees one (release_recv pokes the eventfd when it sees rx_stalled).
bool TcpTransport::ring_has_space(Conn& c) {
  if (c.recv_tail.load(std::memory_order_relaxed) - c.recv_head.load(std::memory_order_seq_cst) < cfg_.nslots)
    return true;
  c.rx_stalled.store(true, std::memory_order_seq_cst);
  if (c.recv_tail.load(std::memory_order_relaxed) - c.recv_head.load(std::memory_order_seq_cst) < cfg_.nslots) {
    c.rx_stalled.store(false);
    return true;
  }
  update_interest(c);
  return false;
}

void TcpTransport::handle_control(Conn& c) {
  const std::string& b = c.control_in;
  if (c.hdr.type == kFrameCall) {
    CallDesc d;
    std::memcpy(&d, b.data(), sizeof(d));
    if (!valid_desc(d)) return protocol_error(c, "impossible call description");
    std::lock_guard<std::mutex> g(c.state_mu);
    c.call = d;
    c.has_call = true;
  } else if (c.hdr.type == kFrameFail) {
    uint32_t kind;
    std::memcpy(&kind, b.data(), 4);
    if (kind > static_cast<uint32_t>(ErrorKind::Peer)) return protocol_error(c, "impossible error kind");
    std::string msg = b.substr(4);
    for (char& ch : msg)  // shown to users: no terminal control characters from the wire
      if (static_cast<unsigned char>(ch) < 0x20 && ch != '\n') ch = '?';
    {
      std::lock_guard<std::mutex> g(c.state_mu);
      if (c.state.load() == static_cast<uint32_t>(PeerState::Alive)) {
        c.fail_kind = static_cast<ErrorKind>(kind);
        c.fail_message = msg;
        c.state.store(static_cast<uint32_t>(PeerState::Failed), std::memory_order_release);
      }
    }
    wake();
  } else if (c.hdr.type == kFrameClose) {
    {
      std::lock_guard<std::mutex> g(c.state_mu);
      c.got_close = true;
      if (c.state.load() == static_cast<uint32_t>(PeerState::Alive))
        c.state.store(static_cast<uint32_t>(PeerState::Closed), std::memory_order_release);
    }
    {
      // The peer reads nothing more: end our side of the stream so its close completes.
      std::lock_guard<std::mutex> g(c.send_mu);
      flush(c);
      if (!c.shut_write && c.fd.load() >= 0) shutdown(c.fd.load(), SHUT_WR);
      c.shut_write = true;
    }
    wake();
  }
}

}  // namespace commlib
