// The receive side of a peer's TCP lanes: the frame parser of each lane that fills the shared
// receive ring (DATA frame s, read from lane s % N, goes to slot s % nslots), and the posted
// receive that lets a chunk's payload go straight to the executor's destination instead.
// Everything here runs under the connection's recv_mu, held by the progress thread or by a caller
// that polls its sockets while it waits (TcpTransport::poll, tcp_spin.cc): whoever holds it reads.
// Small reads go through a per-lane staging buffer (lane_read), so a small frame costs one recv.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/tcp/tcp_conn.h"

namespace commlib {

namespace {
char g_discard[1 << 16];  // where a closing rank drops the payloads it no longer wants

// Whether frame `seq`'s chunk header is in its ring slot (the frame is complete, or its payload is
// being read): what a new posted receive must take as already arrived.
bool header_arrived(const TcpTransport::Lane& l, uint64_t seq) {
  return seq < l.recv_next ||
         (seq == l.recv_next && l.in_body && l.hdr.type == kFrameData && l.body_got >= sizeof(ChunkHeader));
}

// Whether `h` is exactly chunk `seq - first` of the posted message: the call, the offset that
// chunk starts at and the bytes the executor will expect there (so it ends inside dst). 0: it is;
// 1: another message (a later one, or another call); -1: this message, out of step.
int posted_match(const TcpTransport::Conn& c, uint64_t seq, const ChunkHeader& h) {
  const auto& p = c.posted;
  if (!p.active || seq < p.first || h.desc != p.desc) return 1;
  const uint64_t j = seq - p.first;
  if (j >= (p.bytes + p.chunk - 1) / p.chunk) return 1;
  const size_t off = j * p.chunk, expect = std::min(p.chunk, p.bytes - off);
  return h.offset == off && h.bytes == expect ? 0 : -1;
}
}  // namespace

// A waiting caller reads only what it waits for: the lane that carries the next frame the executor
// needs (frame recv_tail), then the next such lane while frames complete, then lane 0 for control
// frames. Idle lanes cost no syscall per spin; the progress thread reads them once the spin ends.
void TcpTransport::read_lanes(Conn& c) {
  auto read = [&](Lane& l) {
    if (l.fd.load() < 0) return;
    if (l.stalled) {
      if (!draining_.load() && l.recv_next - c.recv_head.load() >= cfg_.nslots) return;
      l.stalled = false;
    }
    on_readable(c, l);
  };
  bool read_first = false;
  for (uint32_t k = 0; k < c.nlanes(); ++k) {
    const uint64_t tail = c.recv_tail.load(std::memory_order_relaxed);
    Lane& l = c.lane_of(tail);
    read(l);
    read_first |= l.index == 0;
    if (c.recv_tail.load(std::memory_order_relaxed) == tail) break;
  }
  if (!read_first) read(*c.lanes[0]);
  bool stalled = false;
  for (auto& lp : c.lanes) {
    stalled |= lp->stalled;
    if (lp->fd.load() >= 0) update_interest(c, *lp);
  }
  if (!stalled) c.rx_stalled.store(false);
}

void TcpLink::post_recv(const CallDesc& d, char* dst, size_t bytes, size_t chunk) {
  using Conn = TcpTransport::Conn;
  Conn& c = c_;
  const uint32_t nslots = t_.cfg_.nslots;
  std::lock_guard<std::mutex> g(c.recv_mu);
  Conn::Posted& p = c.posted;
  // The message starts at the next frame the executor reads.
  const uint64_t head = c.recv_head.load(std::memory_order_relaxed);
  p = Conn::Posted{chunk && dst && bytes, d, dst, bytes, chunk, head};
  if (!p.active || t_.draining_.load()) {
    p.active = false;
    return;
  }
  // Frames whose headers already arrived went to the ring (the executor copies them); landing
  // applies to the rest. Anything of this message out of step: land nothing, let the executor
  // report it.
  const size_t stride = c.recv_ring.size() / nslots;
  for (uint64_t s = head; s < head + nslots && p.active; ++s) {
    if (!header_arrived(c.lane_of(s), s)) continue;
    const auto* h = reinterpret_cast<const ChunkHeader*>(c.recv_slot(s, stride, nslots));
    if (posted_match(c, s, *h) < 0) p.active = false;
  }
}

void TcpLink::unpost_recv() {
  TcpTransport::Conn& c = c_;
  std::lock_guard<std::mutex> g(c.recv_mu);
  c.posted.active = false;
  c.posted.dst = nullptr;
  for (auto& l : c.lanes)
    if (l->landing) {  // withdrawn mid-frame (an error path): the rest of that payload is dropped
      l->landing = nullptr;
      l->torn = true;
    }
}

// A DATA frame's chunk header was read and checked: its payload goes to the posted destination
// when it is exactly its chunk of the posted message, else into the ring slot behind its header.
bool TcpTransport::land_or_ring(Conn& c, Lane& l) {
  const size_t stride = c.recv_ring.size() / cfg_.nslots;
  auto* h = reinterpret_cast<ChunkHeader*>(c.recv_slot(l.recv_next, stride, cfg_.nslots));
  const int m = posted_match(c, l.recv_next, *h);
  if (m < 0) c.posted.active = false;  // out of step: the executor sees the chunk in the ring and reports it
  if (m != 0 || h->bytes == 0) return false;
  l.landing = c.posted.dst + h->offset;  // offset + bytes <= posted.bytes (posted_match)
  landed_.fetch_add(h->bytes, std::memory_order_relaxed);
  h->flags |= kChunkLanded;
  return true;
}

// Reads up to `want` bytes for the parser: from the lane's staging buffer while it holds bytes;
// else a small want refills the staging buffer with one recv of whatever the socket holds (up to
// kStageBytes), a large one is read straight into `dst`. Returns like recv (0: end of stream;
// -1 with errno). `*drained`: a recv came back short, so the socket is empty for now and the next
// refill would only return EAGAIN: it is skipped (epoll, or the caller's next poll, comes back).
ssize_t TcpTransport::lane_read(Lane& l, int fd, char* dst, size_t want, bool* drained) {
  if (l.stage_off < l.stage_len) {
    const size_t n = std::min(want, l.stage_len - l.stage_off);
    std::memcpy(dst, l.stage.get() + l.stage_off, n);
    l.stage_off += n;
    return static_cast<ssize_t>(n);
  }
  if (*drained) {
    errno = EAGAIN;
    return -1;
  }
  if (want >= kStageBytes) {
    const ssize_t n = recv(fd, dst, want, MSG_DONTWAIT);
    if (n > 0) recv_reads_.fetch_add(1, std::memory_order_relaxed);
    if (n > 0 && static_cast<size_t>(n) < want) *drained = true;
    return n;
  }
  const ssize_t n = recv(fd, l.stage.get(), kStageBytes, MSG_DONTWAIT);
  if (n <= 0) return n;
  recv_reads_.fetch_add(1, std::memory_order_relaxed);
  if (static_cast<size_t>(n) < kStageBytes) *drained = true;
  l.stage_off = std::min(want, static_cast<size_t>(n));
  l.stage_len = static_cast<size_t>(n);
  std::memcpy(dst, l.stage.get(), l.stage_off);
  return static_cast<ssize_t>(l.stage_off);
}

void TcpTransport::on_readable(Conn& c, Lane& l) {
  const size_t stride = c.recv_ring.size() / cfg_.nslots;
  bool drained = false;
  for (;;) {
    const int fd = l.fd.load();
    if (fd < 0) return;
    char* dst;
    size_t want;
    if (!l.in_body) {
      dst = reinterpret_cast<char*>(&l.hdr) + l.hdr_got;
      want = sizeof(WireHeader) - l.hdr_got;
    } else if (l.hdr.type == kFrameData) {
      if (draining_.load() || l.torn) {
        dst = g_discard;
        want = std::min(sizeof(g_discard), l.hdr.length - l.body_got);
      } else if (l.landing) {  // straight into the posted destination (checked in land_or_ring)
        dst = l.landing + (l.body_got - sizeof(ChunkHeader));
        want = l.hdr.length - l.body_got;
      } else {
        // Only into a free slot: an end of stream or error wakes this thread even while the ring
        // is full, and the slot may still hold a chunk the executor has not read.
        if (l.body_got == 0 && !ring_has_space(c, l)) return;
        dst = c.recv_slot(l.recv_next, stride, cfg_.nslots) + l.body_got;
        // The chunk header first, alone, so it is checked before the payload lands behind it.
        want = l.body_got < sizeof(ChunkHeader) ? sizeof(ChunkHeader) - l.body_got : l.hdr.length - l.body_got;
      }
    } else {
      dst = &l.control_in[l.body_got];
      want = l.hdr.length - l.body_got;
    }
    ssize_t n = want ? lane_read(l, fd, dst, want, &drained) : 0;
    if (want && n == 0) {
      // An orderly end only after this stream's CLOSE; any other end of any lane loses the peer
      // (all its lanes go, so the peer learns it at once too). A closing rank only lets go.
      if (!l.got_close)
        mark_down(c, PeerState::Dead, "connection lost (end of stream without a close on connection " +
                                          std::to_string(l.index) + ")");
      if (l.got_close || draining_.load()) drop_lane(c, l); else drop_conn(c);
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      mark_down(c, PeerState::Dead, std::string("connection lost (") + std::strerror(errno) + " on connection " +
                                        std::to_string(l.index) + ")");
      if (draining_.load()) drop_lane(c, l); else drop_conn(c);
      return;
    }
    if (!l.in_body) {
      l.hdr_got += static_cast<size_t>(n);
      if (l.hdr_got < sizeof(WireHeader)) continue;
      if (!handle_frame_header(c, l)) return;
      continue;
    }
    const size_t before = l.body_got;
    l.body_got += static_cast<size_t>(n);
    if (l.hdr.type == kFrameData && !draining_.load() && before < sizeof(ChunkHeader) &&
        l.body_got >= sizeof(ChunkHeader)) {
      const auto* h = reinterpret_cast<const ChunkHeader*>(c.recv_slot(l.recv_next, stride, cfg_.nslots));
      if (h->bytes != l.hdr.length - sizeof(ChunkHeader) || h->flags != 0 || !valid_desc(h->desc) ||
          h->offset > (uint64_t{1} << 62)) {
        protocol_error(c, l, "impossible chunk header (" + std::to_string(h->bytes) + " bytes at offset " +
                                 std::to_string(h->offset) + ", flags " + std::to_string(h->flags) + ")");
        return;
      }
      land_or_ring(c, l);
    }
    if (l.body_got < l.hdr.length) continue;
    // A whole frame.
    l.in_body = false;
    l.hdr_got = 0;
    l.landing = nullptr;
    l.torn = false;
    if (l.hdr.type != kFrameData)
      handle_control(c, l);
    else if (!draining_.load())
      frame_done(c, l);  // (a torn frame too: its header says kChunkLanded, which no later reader accepts)
  }
}

// Frame l.recv_next is complete: the lane moves to its next frame, and the ring's tail to the
// lowest frame some lane has not completed (all below it are in their slots).
void TcpTransport::frame_done(Conn& c, Lane& l) {
  l.recv_next += c.nlanes();
  uint64_t tail = UINT64_MAX;
  for (auto& x : c.lanes) tail = std::min(tail, x->recv_next);
  if (tail != c.recv_tail.load(std::memory_order_relaxed)) {
    c.recv_tail.store(tail, std::memory_order_release);
    wake();
  }
}

// Checks a complete WireHeader; returns false when reading must stop (bad frame or full ring).
bool TcpTransport::handle_frame_header(Conn& c, Lane& l) {
  const WireHeader& h = l.hdr;
  bool ok = h.magic == kFrameMagic && h.reserved == 0;
  switch (h.type) {
    case kFrameData: ok &= h.length >= sizeof(ChunkHeader) && h.length <= sizeof(ChunkHeader) + cfg_.chunk_bytes; break;
    case kFrameCall: ok &= h.length == sizeof(CallDesc); break;
    case kFrameFail: ok &= h.length >= 4 && h.length <= 4 + kMaxFailMessage; break;
    case kFrameClose: ok &= h.length == 0; break;
    default: ok = false;
  }
  if (!ok) {
    protocol_error(c, l, "impossible frame header (type " + std::to_string(h.type) + ", " +
                             std::to_string(h.length) + " bytes)");
    return false;
  }
  l.in_body = true;
  l.body_got = 0;
  if (h.type != kFrameData) {
    l.control_in.assign(h.length, '\0');
    if (h.length == 0) {
      l.in_body = false;
      l.hdr_got = 0;
      handle_control(c, l);
    }
    return true;
  }
  if (draining_.load()) return true;
  return ring_has_space(c, l);
}

// A data frame needs its ring slot free; until it is, stop reading (and watching) this lane
// until the caller frees one (release_recv pokes the eventfd when it sees rx_stalled).
bool TcpTransport::ring_has_space(Conn& c, Lane& l) {
  auto room = [&] { return l.recv_next - c.recv_head.load(std::memory_order_seq_cst) < cfg_.nslots; };
  if (room()) return true;
  c.rx_stalled.store(true, std::memory_order_seq_cst);
  if (room()) return true;  // (rx_stalled stays set: at worst one spare poke)
  l.stalled = true;
  update_interest(c, l);
  return false;
}

}  // namespace commlib
