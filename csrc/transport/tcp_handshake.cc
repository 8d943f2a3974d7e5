// Making connections: the connecting side runs the handshake on the caller's thread (blocking,
// bounded by the timeout); the accepting side runs it in the progress thread as a small state
// machine, so a slow or hostile client never stalls the job. See tcp_socket.h for the messages.
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "transport/tcp_conn.h"

namespace commlib {

namespace {

constexpr size_t kMaxPending = 16;
constexpr double kHandshakeSeconds = 10.0;

// Sends or receives exactly n bytes before `deadline` (monotonic seconds); false on error/timeout.
bool io_exact(int fd, char* p, size_t n, bool sending, double deadline) {
  while (n) {
    double left = deadline - monotonic_s();
    if (left <= 0) return false;
    pollfd pf{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
    if (::poll(&pf, 1, static_cast<int>(left * 1000) + 1) <= 0) continue;
    ssize_t got = sending ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : recv(fd, p, n, MSG_DONTWAIT);
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

std::string peer_name(int fd) {
  SockAddr a;
  a.len = sizeof(a.ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a.ss), &a.len) != 0) return "?";
  return a.str();
}

}  // namespace

// Lane `lane` of the pair with c.peer is proven; the peer is Alive once all its lanes are.
void TcpTransport::attach(Conn& c, uint32_t lane, int fd) {
  Lane& l = *c.lanes[lane];
  set_nonblocking(fd);
  tune_socket(fd, cfg_.timeout_s);
  {
    std::lock_guard<std::mutex> g(c.recv_mu);
    l.interest = EPOLLIN;
    l.fd.store(fd);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = lane_tag(c.peer, lane);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  bool all = true;
  {
    std::lock_guard<std::mutex> g(connect_mu_);
    l.attached = true;
    for (auto& x : c.lanes) all &= x->attached;
    if (all) {
      std::lock_guard<std::mutex> sg(c.state_mu);
      if (c.state.load() == static_cast<uint32_t>(PeerState::Unknown))
        c.state.store(static_cast<uint32_t>(PeerState::Alive), std::memory_order_release);
    }
  }
  if (all) connect_cv_.notify_all();
}

// Opens lane `lane` to rank q (lower than this rank) and proves both ends; returns the socket.
int TcpTransport::connect_lane(int q, const SockAddr& a, uint32_t lane, double deadline) {
  const std::string me = "rank " + std::to_string(rank_);
  const std::string who = "rank " + std::to_string(q) + " at " + a.str();
  int fd = -1;
  for (;;) {  // the peer listens before it publishes its address, but its host may be slow
    fd = socket(a.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) throw CommError("tcp: socket: " + std::string(std::strerror(errno)));
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&a.ss), a.len);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pf{fd, POLLOUT, 0};
      double left = deadline - monotonic_s();
      if (::poll(&pf, 1, static_cast<int>(std::max(left, 0.0) * 1000) + 1) == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err ? -1 : 0;
        errno = err;
      }
    }
    if (rc == 0) break;
    const int err = errno;
    ::close(fd);
    if (monotonic_s() > deadline)
      throw PeerError(me + " could not connect to " + who + " within " + std::to_string(int(cfg_.timeout_s)) +
                      " s (COMMLIB_TIMEOUT): " + std::strerror(err));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Hello h{};
  h.magic = kHelloMagic;
  h.version = kProtocolVersion;
  h.header_bytes = sizeof(ChunkHeader);
  std::memcpy(h.comm_id, comm_id_, sizeof(comm_id_));
  h.from_rank = static_cast<uint32_t>(rank_);
  h.to_rank = static_cast<uint32_t>(q);
  h.world = static_cast<uint32_t>(size_);
  h.pid = static_cast<int32_t>(getpid());
  h.chunk_bytes = cfg_.chunk_bytes;
  h.lane = lane;
  h.nlanes = cfg_.nconns;
  random_bytes(h.nonce, sizeof(h.nonce));
  Challenge ch{};
  const double hs_deadline = std::min(deadline, monotonic_s() + kHandshakeSeconds);
  bool ok = io_exact(fd, reinterpret_cast<char*>(&h), sizeof(h), true, hs_deadline) &&
            io_exact(fd, reinterpret_cast<char*>(&ch), sizeof(ch), false, hs_deadline);
  if (!ok || ch.magic != kHelloMagic) {
    ::close(fd);
    throw PeerError(me + ": " + who + " refused the connection (different communicator, world size, "
                    "COMMLIB_TCP_CHUNK_BYTES or commlib version?)");
  }
  Digest expect = handshake_mac(key_, "commlib accept", h, ch.nonce), got;
  std::memcpy(got.data(), ch.mac, got.size());
  if (!digest_equal(expect, got)) {
    ::close(fd);
    throw PeerError(me + ": " + who + " did not prove it holds the key (HMAC mismatch): COMMLIB_SECRET must "
                    "be set, and the same, on every rank");
  }
  Response resp{};
  Digest mine = handshake_mac(key_, "commlib connect", h, ch.nonce);
  std::memcpy(resp.mac, mine.data(), mine.size());
  Verdict v{};
  ok = io_exact(fd, reinterpret_cast<char*>(&resp), sizeof(resp), true, hs_deadline) &&
       io_exact(fd, reinterpret_cast<char*>(&v), sizeof(v), false, hs_deadline);
  ::close(ok && v.magic == kHelloMagic && v.accepted == 1 ? -1 : fd);
  if (ok && v.magic == kHelloMagic && v.accepted == kVerdictLanesDiffer)
    throw PeerError(me + ": " + who + " uses COMMLIB_TCP_NCONNS=" + std::to_string(v.nlanes) + ", this rank " +
                    std::to_string(cfg_.nconns) + ": the setting must be the same on every rank");
  if (!ok || v.magic != kHelloMagic || v.accepted != 1)
    throw PeerError(me + ": " + who + " rejected this rank's proof of the key: COMMLIB_SECRET must be the "
                    "same on every rank");
  conns_[q]->pid = ch.pid;
  return fd;
}

void TcpTransport::connect(const std::vector<std::string>& addresses) {
  if (static_cast<int>(addresses.size()) != size_) throw std::invalid_argument("addresses: one per rank expected");
  const double deadline = monotonic_s() + cfg_.timeout_s;
  const std::string me = "rank " + std::to_string(rank_);
  for (int q = 0; q < rank_; ++q) {
    if (!conns_[q]) continue;
    SockAddr a = parse_address(addresses[q]);
    for (uint32_t lane = 0; lane < cfg_.nconns; ++lane) attach(*conns_[q], lane, connect_lane(q, a, lane, deadline));
  }
  // Ranks above this one connect here; the progress thread accepts them.
  std::unique_lock<std::mutex> lk(connect_mu_);
  auto all_in = [&] {
    for (int q = rank_ + 1; q < size_; ++q)
      if (conns_[q] && conns_[q]->state.load() == static_cast<uint32_t>(PeerState::Unknown)) return false;
    return true;
  };
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(std::max(0.0, deadline - monotonic_s())));
  if (!connect_cv_.wait_until(lk, until, all_in)) {
    std::string missing;
    for (int q = rank_ + 1; q < size_; ++q)
      if (conns_[q] && conns_[q]->state.load() == static_cast<uint32_t>(PeerState::Unknown))
        missing += (missing.empty() ? "" : ", ") + std::to_string(q);
    throw PeerError(me + ": rank(s) " + missing + " did not connect within " + std::to_string(int(cfg_.timeout_s)) +
                    " s (COMMLIB_TIMEOUT)");
  }
  // A rank that proved itself but could not be taken (its COMMLIB_TCP_NCONNS differs). (Not any
  // failed peer: a peer may connect, start its first call and fail it before this wait returns.)
  if (!connect_error_.empty()) throw PeerError(me + ": " + connect_error_);
}

void TcpTransport::accept_new() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (pending_.size() >= kMaxPending) {
      rejected_.fetch_add(1);
      log_warn("dropped a connection from " + peer_name(fd) + ": too many handshakes in progress");
      ::close(fd);
      continue;
    }
    auto p = std::make_unique<Pending>();
    p->fd = fd;
    p->from = peer_name(fd);
    p->deadline = monotonic_s() + std::min(kHandshakeSeconds, cfg_.timeout_s);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kTagPending | static_cast<uint64_t>(fd);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    pending_.push_back(std::move(p));
  }
}

void TcpTransport::drop_pending(Pending& p, const std::string& why, bool counted) {
  if (!counted) rejected_.fetch_add(1);
  log_warn("dropped a connection from " + p.from + ": " + why);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p.fd, nullptr);
  ::close(p.fd);
  for (auto& q : pending_)
    if (q.get() == &p) q.reset();
}

void TcpTransport::advance_pending(Pending& p) {
  const size_t need = p.stage == 0 ? sizeof(Hello) : sizeof(Response);
  for (;;) {
    if (p.got == need) break;
    ssize_t n = recv(p.fd, p.buf + p.got, need - p.got, MSG_DONTWAIT);
    if (n == 0) return drop_pending(p, "closed during the handshake");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      return drop_pending(p, std::string("handshake read failed: ") + std::strerror(errno));
    }
    p.got += static_cast<size_t>(n);
  }
  p.got = 0;
  if (p.stage == 0) {
    std::memcpy(&p.hello, p.buf, sizeof(Hello));
    const Hello& h = p.hello;
    if (h.magic != kHelloMagic) return drop_pending(p, "not a commlib connection (bad magic)");
    if (h.version != kProtocolVersion || h.header_bytes != sizeof(ChunkHeader))
      return drop_pending(p, "protocol version " + std::to_string(h.version) + " differs from this rank's");
    if (std::memcmp(h.comm_id, comm_id_, sizeof(comm_id_)) != 0) return drop_pending(p, "from another communicator");
    if (h.world != static_cast<uint32_t>(size_) || h.to_rank != static_cast<uint32_t>(rank_) ||
        h.from_rank >= static_cast<uint32_t>(size_) || h.from_rank <= static_cast<uint32_t>(rank_) ||
        !conns_[h.from_rank])
      return drop_pending(p, "impossible ranks (from " + std::to_string(h.from_rank) + " to " +
                                 std::to_string(h.to_rank) + " of " + std::to_string(h.world) + ")");
    if (h.chunk_bytes != cfg_.chunk_bytes)
      return drop_pending(p, "COMMLIB_TCP_CHUNK_BYTES differs (" + std::to_string(h.chunk_bytes) + ")");
    if (h.nlanes < 1 || h.nlanes > kMaxLanes || h.lane >= h.nlanes)
      return drop_pending(p, "impossible connection " + std::to_string(h.lane) + " of " + std::to_string(h.nlanes));
    Conn& c = *conns_[h.from_rank];
    // (A lane count that differs from ours is only told once the peer has proven itself: stage 1.)
    if (c.state.load() != static_cast<uint32_t>(PeerState::Unknown) ||
        (h.nlanes == cfg_.nconns && c.lanes[h.lane]->attached))
      return drop_pending(p, "rank " + std::to_string(h.from_rank) + " is already connected (connection " +
                                 std::to_string(h.lane) + ")");
    Challenge ch{};
    ch.magic = kHelloMagic;
    ch.pid = static_cast<int32_t>(getpid());
    random_bytes(p.nonce_s, sizeof(p.nonce_s));
    std::memcpy(ch.nonce, p.nonce_s, sizeof(ch.nonce));
    Digest mac = handshake_mac(key_, "commlib accept", h, p.nonce_s);
    std::memcpy(ch.mac, mac.data(), mac.size());
    // 80 bytes into a fresh socket's empty send buffer: a short write means something is wrong.
    if (send(p.fd, &ch, sizeof(ch), MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(sizeof(ch)))
      return drop_pending(p, "could not send the challenge");
    p.stage = 1;
    return;
  }
  Response r;
  std::memcpy(&r, p.buf, sizeof(r));
  Digest expect = handshake_mac(key_, "commlib connect", p.hello, p.nonce_s), got;
  std::memcpy(got.data(), r.mac, got.size());
  Verdict v{kHelloMagic, 0, cfg_.nconns};
  Conn& c = *conns_[p.hello.from_rank];
  const uint32_t lane = p.hello.lane;
  const bool proven = digest_equal(expect, got);
  if (proven && p.hello.nlanes != cfg_.nconns && c.state.load() == static_cast<uint32_t>(PeerState::Unknown)) {
    // A genuine rank of this job with another lane count: both ends fail with the reason.
    v.accepted = kVerdictLanesDiffer;
    (void)!send(p.fd, &v, sizeof(v), MSG_NOSIGNAL | MSG_DONTWAIT);
    const std::string why = "rank " + std::to_string(c.peer) + " uses COMMLIB_TCP_NCONNS=" +
                            std::to_string(p.hello.nlanes) + ", this rank " + std::to_string(cfg_.nconns) +
                            ": the setting must be the same on every rank";
    mark_down(c, PeerState::Failed, why);
    drop_pending(p, why);
    {
      std::lock_guard<std::mutex> g(connect_mu_);
      if (connect_error_.empty()) connect_error_ = why;
    }
    connect_cv_.notify_all();
    return;
  }
  if (!proven || p.hello.nlanes != cfg_.nconns || c.state.load() != static_cast<uint32_t>(PeerState::Unknown) ||
      c.lanes[lane]->attached) {
    // Counted before the refusal goes out: whoever has read the verdict sees the count.
    rejected_.fetch_add(1);
    (void)!send(p.fd, &v, sizeof(v), MSG_NOSIGNAL | MSG_DONTWAIT);
    const std::string who = "rank " + std::to_string(p.hello.from_rank);
    return drop_pending(p, !proven ? who + " failed to prove it holds the key (HMAC mismatch: COMMLIB_SECRET differs?)"
                                   : who + " is already connected (connection " + std::to_string(lane) + ")",
                        /*counted=*/true);
  }
  v.accepted = 1;
  if (send(p.fd, &v, sizeof(v), MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(sizeof(v)))
    return drop_pending(p, "could not send the verdict");
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p.fd, nullptr);
  c.pid = p.hello.pid;
  const int fd = p.fd;
  for (auto& q : pending_)
    if (q.get() == &p) q.reset();
  attach(c, lane, fd);
}

}  // namespace commlib
