// The send side of a peer's TCP lanes, and the caller's end of both rings. The caller fills send
// slots in order; DATA frame s is written on lane s % N (tcp_conn.h) under that lane's lock. The
// caller's thread writes at once what it publishes on lane 0, and every copied (small) frame: no
// hand-off on the latency path. Zero-copy frames (messages of 64 KiB and more) on the other lanes
// go to the progress thread, so two threads write two connections at once: the kernel's work per
// connection runs in the thread that writes it, and that is what one connection cannot spread.
// send_head (what sends_completed reports) is the lowest frame some lane has not finished
// writing, so every frame below it is in the kernel and its slot and source buffer are free.
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/tcp/tcp_conn.h"

namespace commlib {

std::unique_ptr<Link> TcpTransport::make_link(int peer) { return std::make_unique<TcpLink>(*this, peer); }

LinkCaps TcpLink::query_caps() const {
  LinkCaps caps;
  caps.chunk_bytes = t_.chunk_bytes();
  caps.channel_bytes = t_.channel_bytes();
  caps.sends_in_place = true;
  caps.lands_in_place = true;
  return caps;
}

ChunkHeader* TcpLink::acquire_send(char** payload) {
  TcpTransport::Conn& c = c_;
  uint64_t t = c.send_tail.load(std::memory_order_relaxed);
  if (t - c.send_head.load(std::memory_order_acquire) >= t_.cfg_.nslots) return nullptr;
  char* s = c.send_slot(t);
  *payload = s + kSendPrefix;
  return reinterpret_cast<ChunkHeader*>(s + sizeof(WireHeader));
}

void TcpLink::publish_send() { t_.publish(c_, nullptr); }

uint64_t TcpLink::publish_send_in_place(const char* data) { return t_.publish(c_, data); }

uint64_t TcpLink::sends_completed() { return c_.send_head.load(std::memory_order_acquire); }

void TcpLink::detach_sends() {
  TcpTransport::Conn& c = c_;
  std::vector<std::unique_lock<std::mutex>> locks;  // every lane (in lane order): no writer reads a ref meanwhile
  for (auto& l : c.lanes) locks.emplace_back(l->send_mu);
  const uint64_t tail = c.send_tail.load(std::memory_order_relaxed);
  for (uint64_t i = c.send_head.load(std::memory_order_relaxed); i < tail; ++i) {
    const char*& ref = c.send_ref_of(i);
    if (!ref) continue;  // copied, or already written by its lane
    char* s = c.send_slot(i);
    // The whole payload, also of a frame partly written: the bytes are the same, only their home moves.
    std::memcpy(s + kSendPrefix, ref, reinterpret_cast<const ChunkHeader*>(s + sizeof(WireHeader))->bytes);
    ref = nullptr;
  }
}

// Returns the ticket of the published chunk: sends_completed() reaches it once it is written.
uint64_t TcpTransport::publish(Conn& c, const char* ref) {
  uint64_t t = c.send_tail.load(std::memory_order_relaxed);
  c.send_ref_of(t) = ref;
  char* s = c.send_slot(t);
  auto* wh = reinterpret_cast<WireHeader*>(s);
  wh->magic = kFrameMagic;
  wh->type = kFrameData;
  wh->reserved = 0;
  wh->length = sizeof(ChunkHeader) + reinterpret_cast<ChunkHeader*>(s + sizeof(WireHeader))->bytes;
  if (ref) sent_in_place_.fetch_add(wh->length - sizeof(ChunkHeader), std::memory_order_relaxed);
  Lane& l = c.lane_of(t);
  if (l.index) frames_striped_.fetch_add(1, std::memory_order_relaxed);
  c.send_tail.store(t + 1, std::memory_order_seq_cst);
  if (ref && l.index) {  // a large message's frame on another lane: the progress thread writes it
    l.want_write.store(true, std::memory_order_seq_cst);
    request_write();
  } else if (!write_lane(c, l)) {  // the progress thread finishes what the socket would not take
    request_write();
  }
  return t + 1;
}

const ChunkHeader* TcpLink::peek_recv(const char** payload) {
  TcpTransport::Conn& c = c_;
  uint64_t h = c.recv_head.load(std::memory_order_relaxed);
  if (c.recv_tail.load(std::memory_order_acquire) == h) return nullptr;
  char* s = c.recv_slot(h, c.recv_ring.size() / t_.cfg_.nslots, t_.cfg_.nslots);
  *payload = s + sizeof(ChunkHeader);
  return reinterpret_cast<const ChunkHeader*>(s);
}

void TcpLink::release_recv() {
  TcpTransport::Conn& c = c_;
  c.recv_head.store(c.recv_head.load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
  if (c.rx_stalled.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    (void)!write(t_.event_fd_, &one, sizeof(one));
  }
}

void TcpLink::read_peer(void*, uint64_t, size_t) {
  throw CommError("tcp: rank " + std::to_string(peer_) + " cannot be read directly over TCP");
}

bool TcpTransport::write_lane(Conn& c, Lane& l) {
  bool freed = false, done;
  {
    std::lock_guard<std::mutex> g(l.send_mu);
    done = flush_lane(c, l, &freed);
  }
  if (freed) advance_send_head(c);
  return done;
}

// send_head = the lowest frame some lane still has to write. Lanes finish in any order and two
// threads may compute this at once: the head only moves forward.
void TcpTransport::advance_send_head(Conn& c) {
  uint64_t head = UINT64_MAX;
  for (auto& l : c.lanes) head = std::min(head, l->send_next.load(std::memory_order_acquire));
  head = std::min(head, c.send_tail.load(std::memory_order_acquire));
  uint64_t cur = c.send_head.load(std::memory_order_relaxed);
  while (cur < head && !c.send_head.compare_exchange_weak(cur, head, std::memory_order_acq_rel)) {
  }
  wake();
}

// Writes what lane `l` has (control frames between data frames, then its DATA frames in sequence)
// until the socket would block; true when nothing is left. Sets *freed when a frame finished.
bool TcpTransport::flush_lane(Conn& c, Lane& l, bool* freed) {
  const int fd = l.fd.load();
  if (fd < 0 || l.shut_write) {
    l.want_write.store(false);  // (a shut lane would otherwise stay in epoll for EPOLLOUT forever)
    return true;
  }
  const uint64_t stride = c.nlanes();
  for (;;) {
    if (!l.writing_control && l.write_off == 0 && l.control_off < l.control_out.size()) l.writing_control = true;
    iovec iov[2];
    int niov = 1;
    size_t left;
    const uint64_t seq = l.send_next;
    if (l.writing_control) {
      iov[0] = {&l.control_out[l.control_off], l.control_out.size() - l.control_off};
      left = iov[0].iov_len;
    } else {
      if (seq >= c.send_tail.load(std::memory_order_seq_cst)) {
        // Nothing left: clear the hand-off flag, then look once more, so a frame handed off
        // meanwhile is either seen here or finds the flag set again by its publisher.
        l.want_write.store(false, std::memory_order_seq_cst);
        if (seq >= c.send_tail.load(std::memory_order_seq_cst)) return true;
        continue;
      }
      char* s = c.send_slot(seq);
      left = sizeof(WireHeader) + reinterpret_cast<const WireHeader*>(s)->length - l.write_off;
      const char* ref = c.send_ref_of(seq);
      if (!ref) {
        iov[0] = {s + l.write_off, left};
      } else if (l.write_off < kSendPrefix) {  // headers from the slot, payload from the caller
        iov[0] = {s + l.write_off, kSendPrefix - l.write_off};
        iov[1] = {const_cast<char*>(ref), left - iov[0].iov_len};
        niov = iov[1].iov_len ? 2 : 1;
      } else {
        iov[0] = {const_cast<char*>(ref) + (l.write_off - kSendPrefix), left};
      }
    }
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = niov;
    ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        l.want_write.store(true);
        return false;
      }
      l.shut_write = true;
      mark_down(c, PeerState::Dead, "send on connection " + std::to_string(l.index) + " failed: " + std::strerror(errno));
      return true;
    }
    if (l.writing_control) {
      l.control_off += static_cast<size_t>(n);
      if (l.control_off == l.control_out.size()) {
        l.control_out.clear();
        l.control_off = 0;
        l.writing_control = false;
      }
    } else {
      l.write_off += static_cast<size_t>(n);
      if (static_cast<size_t>(n) == left) {
        l.write_off = 0;
        c.send_ref_of(seq) = nullptr;
        l.send_next.store(seq + stride, std::memory_order_release);
        *freed = true;
      }
    }
  }
}

void TcpTransport::request_write() {
  uint64_t one = 1;  // the progress thread watches the lanes that want to write
  (void)!write(event_fd_, &one, sizeof(one));
}

void TcpTransport::enqueue_control(Conn& c, Lane& l, uint16_t type, const void* body, size_t n) {
  {
    std::lock_guard<std::mutex> g(l.send_mu);
    if (l.fd.load() < 0 || l.shut_write) return;
    WireHeader wh{kFrameMagic, type, 0, n};
    l.control_out.append(reinterpret_cast<const char*>(&wh), sizeof(wh));
    if (n) l.control_out.append(static_cast<const char*>(body), n);
  }
  if (!write_lane(c, l)) request_write();
}

}  // namespace commlib
