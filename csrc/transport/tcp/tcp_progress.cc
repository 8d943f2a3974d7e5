// The TCP transport's progress thread: epoll over the listening socket, the handshakes in
// progress, every peer connection and an eventfd the callers poke. It reads incoming frames
// (tcp_recv.cc), finishes blocked sends, vets new connections, and sends this rank's call.
// Everything about one connection's receive side and epoll interest happens under its recv_mu,
// because a caller waiting for data reads the socket itself (TcpTransport::poll).
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/types.h"
#include "transport/tcp/tcp_conn.h"

namespace commlib {

bool valid_desc(const CallDesc& d) {
  return d.coll < static_cast<uint8_t>(Collective::kCount) && d.dtype < static_cast<uint8_t>(DType::kCount) &&
         d.op < static_cast<uint8_t>(RedOp::kCount) && d.count >= 0;
}

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
          if (!c) continue;
          for (auto& l : c->lanes)  // frames handed off by the caller (not under recv_mu: it would stall readers)
            if (l->want_write.load()) write_lane(*c, *l);
          std::lock_guard<std::mutex> g(c->recv_mu);
          // Stalled lanes whose slot is free read again (read_lanes); the others update their
          // interest (a lane that wants to write gets EPOLLOUT).
          for (auto& l : c->lanes) {
            if (l->fd.load() < 0) continue;
            if (l->stalled && (draining_.load() || l->recv_next - c->recv_head.load() < cfg_.nslots)) {
              l->stalled = false;
              on_readable(*c, *l);
            }
          }
          bool stalled = false;
          for (auto& l : c->lanes) {
            stalled |= l->stalled;
            if (l->fd.load() >= 0) update_interest(*c, *l);
          }
          if (!stalled) c->rx_stalled.store(false);
        }
      } else if (tag == kTagPending) {
        for (auto& p : pending_)
          if (p && static_cast<uint64_t>(p->fd) == index) {
            advance_pending(*p);
            break;
          }
        forget_dropped_pending();
      } else if (tag == kTagConn) {
        Conn& c = *conns_[index >> 8];
        Lane& l = *c.lanes[index & 0xff];
        if (evs[i].events & EPOLLOUT) write_lane(c, l);
        std::lock_guard<std::mutex> rg(c.recv_mu);  // a polling caller may be reading it
        if (l.fd.load() < 0) continue;
        if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) on_readable(c, l);
        for (auto& x : c.lanes)  // (the flush may have left another lane wanting to write)
          if (x->fd.load() >= 0) update_interest(c, *x);
      }
    }
    reclaim_reading_if_idle();
    const double now = monotonic_s();
    if (now >= next_call) {
      next_call = now + 0.05;
      send_calls();
      for (auto& p : pending_)
        if (p && now > p->deadline) drop_pending(*p, "handshake not completed in time");
      forget_dropped_pending();
    }
  }
}

void TcpTransport::update_interest(Conn& c, Lane& l) {
  // While a caller polls the socket itself, the progress thread does not watch it for data: a
  // wake-up there would only race the caller for the same bytes (and cost a core on busy hosts).
  uint32_t want = (l.stalled || c.caller_reads ? 0u : static_cast<uint32_t>(EPOLLIN)) |
                  (l.want_write.load() ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  if (want == l.interest) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = lane_tag(c.peer, l.index);
  // Nothing wanted: leave epoll altogether, or an end of stream (always reported) would spin us.
  const int how = want == 0 ? EPOLL_CTL_DEL : l.interest == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
  epoll_ctl(epoll_fd_, how, l.fd.load(), &ev);
  l.interest = want;
}

void TcpTransport::drop_lane(Conn& c, Lane& l) {
  int fd;
  {
    std::lock_guard<std::mutex> g(l.send_mu);
    fd = l.fd.exchange(-1);
    l.shut_write = true;
  }
  if (fd >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
  }
  wake();
}

void TcpTransport::drop_conn(Conn& c) {
  for (auto& l : c.lanes) drop_lane(c, *l);
}

void TcpTransport::protocol_error(Conn& c, Lane& l, const std::string& what) {
  log_warn("dropped the connections from rank " + std::to_string(c.peer) + ": " + what + " on connection " +
           std::to_string(l.index));
  mark_down(c, PeerState::Failed, "rank " + std::to_string(c.peer) + " sent an invalid frame (" + what + ")");
  drop_conn(c);
}

void TcpTransport::handle_control(Conn& c, Lane& l) {
  const std::string& b = l.control_in;
  if (l.hdr.type == kFrameCall) {
    CallDesc d;
    std::memcpy(&d, b.data(), sizeof(d));
    if (!valid_desc(d)) return protocol_error(c, l, "impossible call description");
    std::lock_guard<std::mutex> g(c.state_mu);
    c.call = d;
    c.has_call = true;
  } else if (l.hdr.type == kFrameFail) {
    uint32_t kind;
    std::memcpy(&kind, b.data(), 4);
    if (kind > static_cast<uint32_t>(ErrorKind::Peer)) return protocol_error(c, l, "impossible error kind");
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
  } else if (l.hdr.type == kFrameClose) {
    l.got_close = true;
    {
      std::lock_guard<std::mutex> g(c.state_mu);
      if (c.state.load() == static_cast<uint32_t>(PeerState::Alive))
        c.state.store(static_cast<uint32_t>(PeerState::Closed), std::memory_order_release);
    }
    {
      // The peer reads nothing more here: end our side of this stream so its close completes.
      bool freed = false;
      {
        std::lock_guard<std::mutex> g(l.send_mu);
        flush_lane(c, l, &freed);
        if (!l.shut_write && l.fd.load() >= 0) shutdown(l.fd.load(), SHUT_WR);
        l.shut_write = true;
      }
      if (freed) advance_send_head(c);
    }
    wake();
  }
}

}  // namespace commlib
