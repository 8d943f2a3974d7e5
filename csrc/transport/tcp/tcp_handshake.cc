// Accepting connections: the accepting side of the handshake runs in the progress thread as a small
// state machine, so a slow or hostile client never stalls the job (the connecting side is in
// tcp_connect.cc). See tcp_socket.h for the messages. Unproven connections are bounded in number
// (kMaxPending) and time (kHelloSeconds for the first bytes): a new connection evicts the oldest
// unproven one rather than being refused, so connections held by an outsider cannot keep a rank out.
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "transport/tcp/tcp_conn.h"

namespace commlib {

namespace {

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

void TcpTransport::accept_new() {
  // Bounded per round, so a flood of connections leaves the progress thread time for the rest.
  for (int round = 0; round < 64; ++round) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    forget_dropped_pending();
    if (pending_.size() >= kMaxPending) evict_pending();
    auto p = std::make_unique<Pending>();
    p->fd = fd;
    p->from = peer_name(fd);
    p->accepted_at = monotonic_s();
    p->deadline = p->accepted_at + std::min(kHelloSeconds, cfg_.timeout_s);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kTagPending | static_cast<uint64_t>(fd);
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    pending_.push_back(std::move(p));
    // A real rank sends its Hello right after connecting: it is usually here already, and reading
    // it now moves the connection past the silent ones that evictions pick first. (It may drop
    // the connection: forget_dropped_pending below.)
    advance_pending(*pending_.back());
  }
  forget_dropped_pending();
}

// drop_pending only empties a connection's entry (its callers may be iterating pending_); the
// entries go here, before the progress thread leaves the step that dropped them. An entry left
// behind outlived the thread once: the destructor read a freed connection's descriptor.
void TcpTransport::forget_dropped_pending() {
  pending_.erase(std::remove(pending_.begin(), pending_.end(), nullptr), pending_.end());
}

// Makes room for a new connection: drops the silent one accepted first (nothing received yet),
// else the oldest still sending its Hello, else the oldest waiting for its proof.
void TcpTransport::evict_pending() {
  Pending* victim = nullptr;
  auto rank_of = [](const Pending& p) { return p.stage == 0 ? (p.got == 0 ? 0 : 1) : 2; };
  for (auto& p : pending_) {
    if (!p) continue;
    if (!victim || rank_of(*p) < rank_of(*victim) ||
        (rank_of(*p) == rank_of(*victim) && p->accepted_at < victim->accepted_at))
      victim = p.get();
  }
  if (victim)
    drop_pending(*victim, "evicted to make room: " + std::to_string(kMaxPending) +
                              " handshakes in progress, this one the oldest unproven (a port scan, or "
                              "connections held by another program?)");
  forget_dropped_pending();
}

// A Hello this rank will not take: the connecting rank learns why and fails at once. Counted
// before the reply goes out: whoever has read the refusal sees the count.
void TcpTransport::refuse_pending(Pending& p, const std::string& why) {
  rejected_.fetch_add(1);
  Challenge ch{};
  ch.magic = kRefusedMagic;
  ch.pid = static_cast<int32_t>(getpid());
  std::memcpy(ch.nonce, why.data(), std::min(why.size(), sizeof(ch.nonce) + sizeof(ch.mac) - 1));
  (void)!send(p.fd, &ch, sizeof(ch), MSG_NOSIGNAL | MSG_DONTWAIT);
  drop_pending(p, why, /*counted=*/true);
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
      return refuse_pending(p, "protocol version " + std::to_string(h.version) + " differs from this rank's");
    if (std::memcmp(h.comm_id, comm_id_, sizeof(comm_id_)) != 0) return refuse_pending(p, "from another communicator");
    if (h.world != static_cast<uint32_t>(size_) || h.to_rank != static_cast<uint32_t>(rank_) ||
        h.from_rank >= static_cast<uint32_t>(size_) || h.from_rank <= static_cast<uint32_t>(rank_) ||
        !conns_[h.from_rank])
      return refuse_pending(p, "impossible ranks (from " + std::to_string(h.from_rank) + " to " +
                                 std::to_string(h.to_rank) + " of " + std::to_string(h.world) + ")");
    if (h.chunk_bytes != cfg_.chunk_bytes)
      return refuse_pending(p, "COMMLIB_TCP_CHUNK_BYTES differs (" + std::to_string(h.chunk_bytes) + ")");
    if (h.nlanes < 1 || h.nlanes > kMaxLanes || h.lane >= h.nlanes)
      return refuse_pending(p, "impossible connection " + std::to_string(h.lane) + " of " + std::to_string(h.nlanes));
    Conn& c = *conns_[h.from_rank];
    // (A lane count that differs from ours is only told once the peer has proven itself: stage 1.)
    if (c.state.load() != static_cast<uint32_t>(PeerState::Unknown) ||
        (h.nlanes == cfg_.nconns && c.lanes[h.lane]->attached))
      return refuse_pending(p, "rank " + std::to_string(h.from_rank) + " is already connected (connection " +
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
    p.deadline = p.accepted_at + std::min(kHandshakeSeconds, cfg_.timeout_s);
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
    rejected_.fetch_add(1);  // (before the verdict, as every refusal)
    (void)!send(p.fd, &v, sizeof(v), MSG_NOSIGNAL | MSG_DONTWAIT);
    const std::string why = "rank " + std::to_string(c.peer) + " uses COMMLIB_TCP_NCONNS=" +
                            std::to_string(p.hello.nlanes) + ", this rank " + std::to_string(cfg_.nconns) +
                            ": the setting must be the same on every rank";
    mark_down(c, PeerState::Failed, why);
    drop_pending(p, why, /*counted=*/true);
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
