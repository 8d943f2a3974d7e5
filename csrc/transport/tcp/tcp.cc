#include "transport/tcp/tcp.h"

#include <linux/futex.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "common/params.h"
#include "common/types.h"
#include "transport/tcp/tcp_conn.h"

namespace commlib {

namespace {

size_t round64(size_t x) { return (x + 63) / 64 * 64; }

}  // namespace

double monotonic_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TcpConfig tcp_config_from_env(double timeout_s, int debug) {
  TcpConfig c;
  c.timeout_s = timeout_s;
  c.debug = debug;
  const int64_t b = param_int("COMMLIB_TCP_CHUNK_BYTES", 4096, 64ll << 20);
  if (b % 64) throw std::invalid_argument("COMMLIB_TCP_CHUNK_BYTES: must be a multiple of 64, got " + std::to_string(b));
  c.chunk_bytes = static_cast<uint64_t>(b);
  const int64_t spin = param_int("COMMLIB_TCP_SPIN_US", -1, 10'000'000);
  if (spin >= 0) c.spin_us = spin;
  c.nconns = static_cast<uint32_t>(param_int("COMMLIB_TCP_NCONNS", 1, kMaxLanes));
  c.nslots = std::max<uint32_t>(4, 2 * c.nconns);  // two chunks in flight per lane
  return c;
}

TcpTransport::TcpTransport(int rank, int size, const std::string& comm_id, std::vector<bool> remote, TcpConfig cfg)
    : rank_(rank), size_(size), remote_(std::move(remote)), cfg_(cfg), key_(link_key_from_env()) {
  if (static_cast<int>(remote_.size()) != size) throw std::invalid_argument("remote: one entry per rank expected");
  if (cfg_.nconns < 1 || cfg_.nconns > kMaxLanes || cfg_.nslots < 2 * cfg_.nconns)
    throw std::invalid_argument("COMMLIB_TCP_NCONNS: must be in 1.." + std::to_string(kMaxLanes) + ", got " +
                                std::to_string(cfg_.nconns));
  Sha256 h;
  h.update(comm_id.data(), comm_id.size());
  Digest d = h.finish();
  std::memcpy(comm_id_, d.data(), sizeof(comm_id_));
  conns_.resize(size);
  const size_t send_stride = round64(kSendPrefix + cfg_.chunk_bytes);
  for (int r = 0; r < size; ++r) {
    if (!remote_[r] || r == rank) continue;
    auto c = std::make_unique<Conn>();
    c->peer = r;
    c->slot_stride = send_stride;
    c->send_ring.resize(send_stride * cfg_.nslots);
    c->send_ref.assign(cfg_.nslots, nullptr);
    c->recv_ring.resize(round64(sizeof(ChunkHeader) + cfg_.chunk_bytes) * cfg_.nslots);
    for (uint32_t i = 0; i < cfg_.nconns; ++i) {
      auto l = std::make_unique<Lane>();
      l->index = l->recv_next = i;
      l->send_next.store(i);
      c->lanes.push_back(std::move(l));
    }
    conns_[r] = std::move(c);
  }
  listen_addr_ = choose_listen_address();
  listen_fd_ = socket(listen_addr_.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw CommError(std::string("tcp: socket: ") + std::strerror(errno));
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&listen_addr_.ss), listen_addr_.len) != 0 ||
      listen(listen_fd_, 128) != 0) {
    int e = errno;
    ::close(listen_fd_);
    throw CommError("tcp: cannot listen on " + listen_addr_.str() + ": " + std::strerror(e));
  }
  socklen_t len = sizeof(listen_addr_.ss);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&listen_addr_.ss), &len);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kTagListen;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.u64 = kTagEvent;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &ev);
  thread_ = std::thread([this] { progress_loop(); });
}

TcpTransport::~TcpTransport() {
  close();
  for (auto& c : conns_)
    if (c)
      for (auto& l : c->lanes)
        if (l->fd >= 0) ::close(l->fd);
  for (auto& p : pending_)
    if (p) ::close(p->fd);  // (none is empty once the thread stopped; checked anyway)
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (event_fd_ >= 0) ::close(event_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

TcpTransport::Conn* TcpTransport::conn(int peer) const {
  Conn* c = (peer >= 0 && peer < size_) ? conns_[peer].get() : nullptr;
  if (!c) throw CommError("tcp: rank " + std::to_string(peer) + " is not reached over TCP from rank " + std::to_string(rank_));
  return c;
}

void TcpTransport::log_warn(const std::string& msg) {
  // Bounded: a flood of bad connections must not flood the log.
  int n = warnings_.fetch_add(1);
  if (n < 20)
    std::fprintf(stderr, "commlib WARN rank %d: %s\n", rank_, msg.c_str());
  else if (n == 20)
    std::fprintf(stderr, "commlib WARN rank %d: further connection warnings suppressed\n", rank_);
}

void TcpTransport::wake() {
  events_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst))
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&events_), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
  if (waker_) waker_->wake();
}

void TcpTransport::wait_events(uint32_t seen, int64_t timeout_us) {
  struct timespec ts = {static_cast<time_t>(timeout_us / 1000000), static_cast<long>((timeout_us % 1000000) * 1000)};
  sleeping_.store(1, std::memory_order_seq_cst);
  if (events_.load(std::memory_order_seq_cst) == seen)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&events_), FUTEX_WAIT_PRIVATE, seen, &ts, nullptr, 0);
  sleeping_.store(0, std::memory_order_relaxed);
}

// ---- control plane ----

void TcpTransport::mark_down(Conn& c, PeerState st, const std::string& why) {
  {
    std::lock_guard<std::mutex> g(c.state_mu);
    uint32_t cur = c.state.load();
    if (cur != static_cast<uint32_t>(PeerState::Alive) && cur != static_cast<uint32_t>(PeerState::Unknown)) return;
    if (st == PeerState::Failed) c.fail_kind = ErrorKind::Peer;
    c.fail_message = why;
    c.state.store(static_cast<uint32_t>(st), std::memory_order_release);
  }
  wake();
}

PeerStatus TcpTransport::peer_status(int peer, bool check_process) {
  Conn& c = *conn(peer);
  PeerStatus st;
  st.state = static_cast<PeerState>(c.state.load(std::memory_order_acquire));
  // A peer that published its failure and then lost every connection without closing them has
  // died since (a failed state is never replaced by mark_down): the slow check says so, as shm's
  // process check does for a live state, so that a shrink sees a survivor die after its PeerError.
  if (check_process && st.state == PeerState::Failed && !c.lanes.empty() && !c.any_fd()) {
    std::lock_guard<std::mutex> g(c.recv_mu);  // got_close is the parsers'
    bool closed = false;
    for (auto& l : c.lanes) closed = closed || l->got_close;
    if (!closed) {
      st.state = PeerState::Dead;
      st.message = "connection lost after it failed";
      return st;
    }
  }
  if (st.state == PeerState::Failed || st.state == PeerState::Dead) {
    // Dead carries the link's reason ("connection lost ...") for the PeerError's detail.
    std::lock_guard<std::mutex> g(c.state_mu);
    st.kind = c.fail_kind;
    st.message = c.fail_message;
  }
  return st;
}

void TcpTransport::publish_failure(ErrorKind kind, const std::string& message) {
  std::string body(4 + std::min(message.size(), kMaxFailMessage), '\0');
  uint32_t k = static_cast<uint32_t>(kind);
  std::memcpy(&body[0], &k, 4);
  std::memcpy(&body[4], message.data(), body.size() - 4);
  for (auto& c : conns_)
    if (c && c->state.load() == static_cast<uint32_t>(PeerState::Alive))
      enqueue_control(*c, *c->lanes[0], kFrameFail, body.data(), body.size());
}

void TcpTransport::publish_call(const CallDesc& d) {
  std::lock_guard<std::mutex> g(call_mu_);
  my_call_ = d;
  ++my_call_version_;
}

void TcpTransport::send_calls() {
  CallDesc d;
  {
    std::lock_guard<std::mutex> g(call_mu_);
    if (my_call_version_ == sent_call_version_) return;
    sent_call_version_ = my_call_version_;
    d = my_call_;
  }
  for (auto& c : conns_)
    if (c && c->state.load() == static_cast<uint32_t>(PeerState::Alive)) enqueue_control(*c, *c->lanes[0], kFrameCall, &d, sizeof(d));
}

bool TcpTransport::peer_call(int peer, CallDesc* d) {
  Conn& c = *conn(peer);
  std::lock_guard<std::mutex> g(c.state_mu);
  if (!c.has_call) return false;
  *d = c.call;
  return true;
}

int TcpTransport::peer_pid(int peer) { return conn(peer)->pid; }

void TcpTransport::close() {
  {
    std::lock_guard<std::mutex> g(connect_mu_);
    if (closed_) return;
    closed_ = true;
  }
  hold_reading(false);  // the progress thread reads every socket to its end from here on
  // Tell every peer, let the progress thread flush what is queued, then half-close and wait
  // (bounded) for the peers' end of stream: closing a socket with unread data would reset it and
  // could destroy data the peer has not read yet.
  draining_.store(true);
  for (auto& c : conns_)
    if (c)
      for (auto& l : c->lanes) enqueue_control(*c, *l, kFrameClose, nullptr, 0);  // every stream ends with it
  uint64_t poke = 1;  // the progress thread resumes reading stalled sockets, to drain them
  (void)!write(event_fd_, &poke, sizeof(poke));
  const double limit = std::min(cfg_.timeout_s, 5.0);
  auto wait_until = [&](auto done) {
    const double end = monotonic_s() + limit;
    while (!done() && monotonic_s() < end) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  wait_until([&] {
    for (auto& c : conns_) {
      if (!c) continue;
      const uint64_t tail = c->send_tail.load();
      for (auto& l : c->lanes) {
        std::lock_guard<std::mutex> g(l->send_mu);
        if (l->fd.load() >= 0 && !l->shut_write && (l->send_next < tail || !l->control_out.empty())) return false;
      }
    }
    return true;
  });
  for (auto& c : conns_) {
    if (!c) continue;
    for (auto& l : c->lanes) {
      std::lock_guard<std::mutex> g(l->send_mu);
      if (l->fd.load() >= 0 && !l->shut_write) shutdown(l->fd.load(), SHUT_WR);
      l->shut_write = true;
    }
  }
  wait_until([&] {
    for (auto& c : conns_)
      if (c && c->any_fd()) return false;  // the progress thread closes a socket at its EOF
    return true;
  });
  stop_.store(true);
  uint64_t one = 1;
  (void)!write(event_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

}  // namespace commlib
