// commlib's store, spoken from C++ (store_client.h): TCPStore's set and check-and-read, its failures
// under its classes and texts (commlib/bootstrap/store.py `_exchange`, `_refused`, `get`).
#include "bootstrap/store_client.h"

#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "bootstrap/store_error.h"
#include "bootstrap/store_wire.h"

namespace commlib {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void put_u32(std::string* out, uint32_t n) {
  const uint32_t be = htonl(n);
  out->append(reinterpret_cast<const char*>(&be), 4);
}

void put_frame(std::string* out, const std::string& bytes) {
  put_u32(out, static_cast<uint32_t>(bytes.size()));
  *out += bytes;
}

std::string command(uint8_t cmd) { return std::string(1, static_cast<char>(cmd)); }

// Python's str() of an OSError: "[Errno N] text".
std::string errno_text(int err) { return "[Errno " + std::to_string(err) + "] " + std::strerror(err); }

// The errors Python's socket raises as ConnectionError (the server closed or reset the connection).
bool connection_error(int err) {
  return err == ECONNRESET || err == EPIPE || err == ECONNREFUSED || err == ECONNABORTED;
}

constexpr int kTimedOut = -1;  // (fail_io: the deadline passed, Python's socket.timeout)
constexpr int kClosed = -2;    // (fail_io: the peer closed, Python's ConnectionError("store connection closed"))

}  // namespace

void StoreClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void StoreClient::fail_io(const char* op, const std::string& key, int err) {
  close();  // (the connection's state is unknown: the next operation opens another)
  const std::string head = "store at " + a_.where + ": ";
  const std::string what = std::string(op) + " " + python_str_repr(key);
  if (err == kTimedOut)
    throw StoreError(StoreError::Kind::Rendezvous, head + "no answer to " + what + " within " + python_g(a_.timeout_s) +
                                                       " s (COMMLIB_TIMEOUT); expected a commlib store" +
                                                       a_.silent_advice);
  if (err == kClosed || connection_error(err))
    throw StoreError(StoreError::Kind::Lost, head + "connection lost during " + what + " (" +
                                                 (err == kClosed ? std::string("store connection closed")
                                                                 : errno_text(err)) +
                                                 "): " + a_.lost_advice);
  throw StoreError(StoreError::Kind::Rendezvous,
                   head + "connection lost during " + what + " (" + errno_text(err) + "); expected a commlib store");
}

void StoreClient::connect(const char* op, const std::string& key) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(a_.host.c_str(), std::to_string(a_.port).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr)
    throw StoreError(StoreError::Kind::Rendezvous, "store at " + a_.where + ": cannot resolve " + a_.host + " (" +
                                                       gai_strerror(rc) + ")");
  fd_ = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) {
    const int err = errno;
    freeaddrinfo(found);
    fail_io(op, key, err);
  }
  int err = ::connect(fd_, found->ai_addr, found->ai_addrlen) == 0 ? 0 : errno;
  freeaddrinfo(found);
  if (err == EINPROGRESS) {
    pollfd p{fd_, POLLOUT, 0};
    const int n = ::poll(&p, 1, static_cast<int>(a_.timeout_s * 1000));
    if (n == 0) fail_io(op, key, kTimedOut);
    socklen_t len = sizeof err;
    err = n < 0 ? errno : (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) == 0 ? err : errno);
  }
  // Refused: nobody listens at an address the Python store's own connection reached (its hello
  // answered when the set-up store was read from it), so the server is gone. That is the event the
  // Python store meets as its open connection closed by the server, and it is named as that
  // ("store connection closed", kClosed): this client reopens the store's connection per set-up only
  // so that an idle rank does not hold a server waiting for its clients to go (store_lease.py), and
  // errno's "Connection refused" would read as a wrong address or a server never started.
  if (err == ECONNREFUSED) fail_io(op, key, kClosed);
  if (err != 0) fail_io(op, key, err);
  const int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // The hello: the server must be a commlib store (TCPStore's constructor's check). Its failures
  // name the operation that opened the connection, as the Python store's open connection would.
  const std::string reply = exchange(op, key, [] {
    std::string r;
    put_frame(&r, command(store_wire::kHello));
    return r;
  }());
  if (reply != store_wire::kHelloReply) {
    close();
    throw StoreError(StoreError::Kind::Rendezvous, "store at " + a_.where + ": answered b" +
                                                       python_str_repr(reply.substr(0, 32)) +
                                                       ", expected a commlib store's hello");
  }
}

void StoreClient::send_all(const char* op, const std::string& key, const std::string& bytes) {
  const double deadline = now_s() + a_.timeout_s;
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) fail_io(op, key, errno);
    const double left = deadline - now_s();
    pollfd p{fd_, POLLOUT, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left * 1000) + 1) == 0) fail_io(op, key, kTimedOut);
  }
}

void StoreClient::recv_exact(const char* op, const std::string& key, char* out, size_t n, double deadline) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd_, out + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) fail_io(op, key, kClosed);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) fail_io(op, key, errno);
    const double left = deadline - now_s();
    pollfd p{fd_, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left * 1000) + 1) == 0) fail_io(op, key, kTimedOut);
  }
}

std::string StoreClient::exchange(const char* op, const std::string& key, const std::string& request) {
  const double deadline = now_s() + a_.timeout_s;
  send_all(op, key, request);
  uint32_t be = 0;
  recv_exact(op, key, reinterpret_cast<char*>(&be), 4, deadline);
  const uint32_t n = ntohl(be);
  if (n > store_wire::kMaxFrame + 1) {  // refused before reading: a frame may announce gigabytes
    close();
    throw StoreError(StoreError::Kind::Rendezvous,
                     "store at " + a_.where + ": answered " + op + " " + python_str_repr(key) +
                         " with a malformed frame (frame of " + std::to_string(n) + " bytes exceeds the " +
                         std::to_string(store_wire::kMaxFrame + 1) + "-byte limit); expected a commlib store");
  }
  std::string reply(n, '\0');
  recv_exact(op, key, reply.data(), n, deadline);
  return reply;
}

void StoreClient::set(const std::string& key, const std::string& value) {
  if (fd_ < 0) connect("set", key);
  std::string req;
  put_frame(&req, command(store_wire::kSet));
  put_frame(&req, key);
  put_frame(&req, value);
  const std::string reply = exchange("set", key, req);
  const std::string refused = store_wire::kRefused;
  if (reply.compare(0, refused.size(), refused) == 0) {
    std::string why = reply.substr(refused.size(), 500);
    throw StoreError(StoreError::Kind::Rendezvous,
                     "store at " + a_.where + ": refused set " + python_str_repr(key) + ": " + why);
  }
}

bool StoreClient::try_get(const std::string& key, std::string* value, const char* op) {
  if (fd_ < 0) connect(op, key);
  std::string req;
  put_frame(&req, command(store_wire::kGet));
  put_frame(&req, key);
  const double no_wait = 0.0;  // f64, big-endian: the server answers at once
  uint64_t bits;
  std::memcpy(&bits, &no_wait, 8);
  bits = htobe64(bits);
  put_u32(&req, 8);
  req.append(reinterpret_cast<const char*>(&bits), 8);
  std::string reply = exchange(op, key, req);
  if (reply.size() == 1 && reply[0] == '\0') return false;
  if (reply.empty() || reply[0] != '\x01')
    throw StoreError(StoreError::Kind::Rendezvous,
                     "store at " + a_.where + ": malformed answer to get " + python_str_repr(key));
  value->assign(reply, 1, std::string::npos);
  return true;
}

}  // namespace commlib
