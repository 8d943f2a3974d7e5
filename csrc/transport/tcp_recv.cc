// The receive side of a TCP connection: the frame parser that fills the receive ring, and the
// posted receive that lets a chunk's payload go straight to the executor's destination instead.
// Everything here runs under the connection's recv_mu, held by the progress thread or by a caller
// that polls its sockets while it waits (TcpTransport::poll): whoever holds it reads.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/tcp_conn.h"

namespace commlib {

namespace {
char g_discard[1 << 16];  // where a closing rank drops the payloads it no longer wants

// Payload bytes the next chunk of a posted message must carry (the executor's own rule).
size_t expected_chunk(const TcpTransport::Conn& c) {
  return std::min(c.posted.chunk, c.posted.bytes - c.posted.next);
}
}  // namespace

void TcpTransport::poll() {
  for (auto& cp : conns_) {
    if (!cp) continue;
    Conn& c = *cp;
    std::unique_lock<std::mutex> lk(c.recv_mu, std::try_to_lock);
    if (!lk.owns_lock() || c.fd.load() < 0) continue;  // the progress thread is at it
    if (c.rx_stalled.load()) {
      if (c.recv_tail.load() - c.recv_head.load() >= cfg_.nslots) continue;
      c.rx_stalled.store(false);
    }
    const uint64_t before = c.recv_tail.load(std::memory_order_relaxed);
    on_readable(c);
    frames_read_by_caller_.fetch_add(c.recv_tail.load(std::memory_order_relaxed) - before, std::memory_order_relaxed);
    if (c.fd.load() >= 0) update_interest(c);
  }
}

void TcpTransport::hold_reading(bool hold) {
  for (auto& cp : conns_) {
    if (!cp) continue;
    std::lock_guard<std::mutex> g(cp->recv_mu);
    cp->caller_reads = hold;
    if (cp->fd.load() >= 0) update_interest(*cp);
  }
}

void TcpTransport::post_recv(int peer, const CallDesc& d, char* dst, size_t bytes, size_t chunk) {
  Conn& c = *conn(peer);
  std::lock_guard<std::mutex> g(c.recv_mu);
  Conn::Posted& p = c.posted;
  p = Conn::Posted{true, d, dst, bytes, chunk, 0};
  if (!chunk || !dst) {
    p.active = false;
    return;
  }
  // What already arrived (in the ring, or whose header was read) is the start of this message:
  // the executor copies those chunks; landing starts after them. Anything out of step: land nothing
  // and let the executor report it.
  const size_t stride = c.recv_ring.size() / cfg_.nslots;
  uint64_t end = c.recv_tail.load(std::memory_order_relaxed);
  if (c.in_body && c.hdr.type == kFrameData && c.body_got >= sizeof(ChunkHeader) && !draining_.load()) ++end;
  for (uint64_t i = c.recv_head.load(std::memory_order_relaxed); i < end && p.active; ++i) {
    const auto* h = reinterpret_cast<const ChunkHeader*>(c.recv_slot(i, stride, cfg_.nslots));
    if (h->desc == d && h->offset == p.next && h->bytes == expected_chunk(c) && h->bytes)
      p.next += h->bytes;
    else
      p.active = false;
  }
}

void TcpTransport::unpost_recv(int peer) {
  Conn& c = *conn(peer);
  std::lock_guard<std::mutex> g(c.recv_mu);
  c.posted.active = false;
  c.posted.dst = nullptr;
  if (c.landing) {  // withdrawn mid-frame (an error path): the rest of that payload is dropped
    c.landing = nullptr;
    c.torn = true;
  }
}

// A DATA frame's chunk header was read and checked: its payload goes to the posted destination
// when it is exactly the next chunk of the posted message (same call, the offset that follows, the
// size the executor expects, inside the destination), else into the ring slot behind its header.
bool TcpTransport::land_or_ring(Conn& c) {
  const size_t stride = c.recv_ring.size() / cfg_.nslots;
  auto* h = reinterpret_cast<ChunkHeader*>(c.recv_slot(c.recv_tail.load(std::memory_order_relaxed), stride, cfg_.nslots));
  Conn::Posted& p = c.posted;
  if (!p.active || h->desc != p.desc) return false;
  const size_t expect = expected_chunk(c);
  if (h->offset != p.next || h->bytes != expect || expect == 0) {
    p.active = false;  // out of step: the executor sees the chunk in the ring and reports it
    return false;
  }
  c.landing = p.dst + p.next;  // p.next + expect <= p.bytes: expect is capped by what is left
  landed_.fetch_add(expect, std::memory_order_relaxed);
  p.next += expect;
  h->flags |= kChunkLanded;
  return true;
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
      if (draining_.load() || c.torn) {
        dst = g_discard;
        want = std::min(sizeof(g_discard), c.hdr.length - c.body_got);
      } else if (c.landing) {  // straight into the posted destination (checked in land_or_ring)
        dst = c.landing + (c.body_got - sizeof(ChunkHeader));
        want = c.hdr.length - c.body_got;
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
      land_or_ring(c);
    }
    if (c.body_got < c.hdr.length) continue;
    // A whole frame.
    c.in_body = false;
    c.hdr_got = 0;
    c.landing = nullptr;
    c.torn = false;
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

}  // namespace commlib
