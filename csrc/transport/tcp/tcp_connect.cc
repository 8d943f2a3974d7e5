// The connecting side of the TCP handshake (the accepting side is tcp_handshake.cc): runs on the
// caller's thread, blocking, bounded by the timeout. A connection the peer closes before its
// challenge (it evicted us to make room, or dropped us after kHelloSeconds while busy) is retried
// with back-off until the deadline, so an outsider holding connections at the peer's port delays
// the job by at most a few round trips; a peer that answers "refused" fails the job at once.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "transport/tcp/tcp_conn.h"

namespace commlib {

namespace {

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

// A connected socket to `a`, retrying refused connections until `deadline` (the peer listens
// before it publishes its address, but its host may be slow).
int open_connection(const SockAddr& a, double deadline, const std::string& me, const std::string& who,
                    double timeout_s, const std::function<void()>& poll) {
  for (;;) {
    int fd = socket(a.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
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
    if (rc == 0) return fd;
    const int err = errno;
    ::close(fd);
    if (monotonic_s() > deadline)
      throw PeerError(me + " could not connect to " + who + " within " + std::to_string(int(timeout_s)) +
                      " s (COMMLIB_TIMEOUT): " + std::strerror(err));
    if (poll) poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The reason text a refusing peer put in its Challenge (printable bytes only: it is untrusted).
std::string refusal_text(const Challenge& ch) {
  std::string out;
  const char* p = reinterpret_cast<const char*>(ch.nonce);
  for (size_t i = 0; i < sizeof(ch.nonce) + sizeof(ch.mac) && p[i]; ++i) out += (p[i] >= 32 && p[i] < 127) ? p[i] : '?';
  return out.empty() ? "no reason given" : out;
}

}  // namespace

// Opens lane `lane` to rank q (lower than this rank) and proves both ends; returns the socket.
int TcpTransport::connect_lane(int q, const SockAddr& a, uint32_t lane, double deadline,
                               const std::function<void()>& poll) {
  const std::string me = "rank " + std::to_string(rank_);
  const std::string who = "rank " + std::to_string(q) + " at " + a.str();
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
  int unanswered = 0;
  double pause = 0.02;
  for (;;) {
    const int fd = open_connection(a, deadline, me, who, cfg_.timeout_s, poll);
    random_bytes(h.nonce, sizeof(h.nonce));  // a fresh nonce per try: nothing is replayed
    const double hs_deadline = std::min(deadline, monotonic_s() + kHandshakeSeconds);
    Challenge ch{};
    bool ok = io_exact(fd, reinterpret_cast<char*>(&h), sizeof(h), true, hs_deadline) &&
              io_exact(fd, reinterpret_cast<char*>(&ch), sizeof(ch), false, hs_deadline);
    if (ok && ch.magic == kRefusedMagic) {
      ::close(fd);
      throw PeerError(me + ": " + who + " refused the connection: " + refusal_text(ch));
    }
    if (ok && ch.magic != kHelloMagic) {
      ::close(fd);
      throw PeerError(me + ": " + who + " answered with something that is not a commlib handshake (another "
                      "program at that address?)");
    }
    Verdict v{};
    if (ok) {
      Digest expect = handshake_mac(key_, "commlib accept", h, ch.nonce), got;
      std::memcpy(got.data(), ch.mac, got.size());
      if (!digest_equal(expect, got)) {
        ::close(fd);
        throw PeerError(me + ": " + who + " did not prove it holds the key (HMAC mismatch): COMMLIB_SECRET "
                        "must be set, and the same, on every rank");
      }
      Response resp{};
      Digest mine = handshake_mac(key_, "commlib connect", h, ch.nonce);
      std::memcpy(resp.mac, mine.data(), mine.size());
      ok = io_exact(fd, reinterpret_cast<char*>(&resp), sizeof(resp), true, hs_deadline) &&
           io_exact(fd, reinterpret_cast<char*>(&v), sizeof(v), false, hs_deadline);
    }
    if (ok && v.magic == kHelloMagic && v.accepted == 1) {
      conns_[q]->pid = ch.pid;
      return fd;
    }
    ::close(fd);
    if (ok && v.magic == kHelloMagic && v.accepted == kVerdictLanesDiffer)
      throw PeerError(me + ": " + who + " uses COMMLIB_TCP_NCONNS=" + std::to_string(v.nlanes) + ", this rank " +
                      std::to_string(cfg_.nconns) + ": the setting must be the same on every rank");
    if (ok)
      throw PeerError(me + ": " + who + " rejected this rank's proof of the key: COMMLIB_SECRET must be the "
                      "same on every rank");
    // Closed or unanswered before its verdict: the peer evicted or timed us out while busy.
    ++unanswered;
    const double left = deadline - monotonic_s();
    if (left <= 0)
      throw PeerError(me + " could not complete the handshake with " + who + " within " +
                      std::to_string(int(cfg_.timeout_s)) + " s (COMMLIB_TIMEOUT): " + std::to_string(unanswered) +
                      " connection(s) were closed or went unanswered mid-handshake. Its pending handshakes may be "
                      "taken by other connections (an outsider at its port: its log names the dropped "
                      "connections), or it is stuck");
    if (poll) poll();
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(pause, left)));
    pause = std::min(pause * 2, 0.5);
  }
}

void TcpTransport::connect(const std::vector<std::string>& addresses, const std::function<void()>& poll) {
  if (static_cast<int>(addresses.size()) != size_) throw std::invalid_argument("addresses: one per rank expected");
  const double deadline = monotonic_s() + cfg_.timeout_s;
  const std::string me = "rank " + std::to_string(rank_);
  for (int q = 0; q < rank_; ++q) {
    if (!conns_[q]) continue;
    SockAddr a = parse_address(addresses[q]);
    for (uint32_t lane = 0; lane < cfg_.nconns; ++lane)
      attach(*conns_[q], lane, connect_lane(q, a, lane, deadline, poll));
  }
  // Ranks above this one connect here; the progress thread accepts them.
  std::unique_lock<std::mutex> lk(connect_mu_);
  auto all_in = [&] {
    for (int q = rank_ + 1; q < size_; ++q)
      if (conns_[q] && conns_[q]->state.load() == static_cast<uint32_t>(PeerState::Unknown)) return false;
    return true;
  };
  // In slices, `poll` between them (unlocked: the progress thread takes connect_mu_ to say who came).
  bool all = all_in();
  while (!all && monotonic_s() < deadline) {
    const double slice = std::min(poll ? 0.02 : deadline - monotonic_s(), std::max(0.0, deadline - monotonic_s()));
    all = connect_cv_.wait_for(lk, std::chrono::duration<double>(slice), all_in);
    if (!all && poll) {
      lk.unlock();
      poll();
      lk.lock();
    }
  }
  if (!all && !all_in()) {
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

}  // namespace commlib
