#include "transport/tcp/tcp_socket.h"

#include "common/params.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace commlib {

std::string SockAddr::str() const {
  char host[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
  }
  auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
  return "[" + std::string(host) + "]:" + std::to_string(ntohs(a->sin6_port));
}

namespace {

struct IfFilter {
  std::vector<std::string> prefixes;
  bool exclude = false, exact = false;
  bool matches(const std::string& name) const {
    bool hit = false;
    for (const auto& p : prefixes) hit |= exact ? name == p : name.compare(0, p.size(), p) == 0;
    return exclude ? !hit : hit;
  }
};

IfFilter parse_ifname(const std::string& v) {
  IfFilter f;
  std::string s = v;
  if (!s.empty() && s[0] == '^') {
    f.exclude = true;
    s.erase(0, 1);
  }
  if (!s.empty() && s[0] == '=') {
    f.exact = true;
    s.erase(0, 1);
  }
  size_t start = 0;
  while (start <= s.size()) {
    size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) f.prefixes.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return f;
}

int family_from_env() {
  const std::string s = param_choice("COMMLIB_SOCKET_FAMILY", {"AF_INET", "AF_INET6", "ipv4", "ipv6", "4", "6"});
  if (s.empty()) return AF_UNSPEC;
  return s == "AF_INET6" || s == "ipv6" || s == "6" ? AF_INET6 : AF_INET;
}

bool usable(const ifaddrs* ifa, int family) {
  if (!ifa->ifa_addr || !(ifa->ifa_flags & IFF_UP)) return false;
  int f = ifa->ifa_addr->sa_family;
  if (f != AF_INET && f != AF_INET6) return false;
  if (family != AF_UNSPEC && f != family) return false;
  if (f == AF_INET6) {  // link-local addresses need a scope id peers cannot use: skip them
    auto* a = reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr);
    if (IN6_IS_ADDR_LINKLOCAL(&a->sin6_addr)) return false;
  }
  return true;
}

}  // namespace

SockAddr choose_listen_address() {
  const int family = family_from_env();
  const std::string env = param_string("COMMLIB_SOCKET_IFNAME");
  const bool user = !env.empty();
  IfFilter filter = user ? parse_ifname(env) : IfFilter{};
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw std::runtime_error(std::string("getifaddrs: ") + std::strerror(errno));
  SockAddr out;
  // Default: first pass skips loopback and docker bridges, second pass takes loopback. IPv4 before
  // IPv6 when the family is not forced.
  for (int pass = 0; pass < 2 && !out.len; ++pass) {
    for (int fam : {AF_INET, AF_INET6}) {
      if (family != AF_UNSPEC && fam != family) continue;
      for (ifaddrs* ifa = list; ifa && !out.len; ifa = ifa->ifa_next) {
        if (!usable(ifa, fam)) continue;
        std::string name = ifa->ifa_name;
        bool loop = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
        bool ok = user ? filter.matches(name) : (pass == 0 ? !loop && name.compare(0, 6, "docker") != 0 : loop);
        if (!ok) continue;
        std::memcpy(&out.ss, ifa->ifa_addr, fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
        out.len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      }
      if (out.len) break;
    }
    if (user) break;
  }
  freeifaddrs(list);
  if (!out.len)
    throw std::invalid_argument(std::string("COMMLIB_SOCKET_IFNAME: no interface that is up matches '") +
                                env + "'" + (family != AF_UNSPEC ? " with COMMLIB_SOCKET_FAMILY" : ""));
  return out;
}

SockAddr parse_address(const std::string& s) {
  std::string host, port;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find("]:");
    if (close == std::string::npos) throw std::invalid_argument("address: malformed '" + s + "'");
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    size_t colon = s.rfind(':');
    if (colon == std::string::npos) throw std::invalid_argument("address: malformed '" + s + "'");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || !res)
    throw std::invalid_argument("address: not a numeric host:port: '" + s + "'");
  SockAddr out;
  std::memcpy(&out.ss, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  freeaddrinfo(res);
  return out;
}

void tune_socket(int fd, double timeout_s) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  // Probe an idle peer after a tenth of the timeout, so a host that vanished without a FIN or RST
  // (cable pulled, interface down) fails the connection well within COMMLIB_TIMEOUT.
  int idle = std::max(1, static_cast<int>(timeout_s / 10));
  int interval = std::max(1, idle / 3), count = 3;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  unsigned user_timeout_ms = static_cast<unsigned>(std::min(timeout_s, 3600.0) * 1000);
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

Digest handshake_mac(const std::string& key, const char* label, const Hello& h, const uint8_t nonce_s[32]) {
  std::string m(label);
  m.append(reinterpret_cast<const char*>(h.comm_id), sizeof(h.comm_id));
  m.append(reinterpret_cast<const char*>(&h.from_rank), sizeof(h.from_rank));
  m.append(reinterpret_cast<const char*>(&h.to_rank), sizeof(h.to_rank));
  m.append(reinterpret_cast<const char*>(&h.lane), sizeof(h.lane));
  m.append(reinterpret_cast<const char*>(&h.nlanes), sizeof(h.nlanes));
  m.append(reinterpret_cast<const char*>(h.nonce), sizeof(h.nonce));
  m.append(reinterpret_cast<const char*>(nonce_s), 32);
  return hmac_sha256(key, m.data(), m.size());
}

void random_bytes(uint8_t* out, size_t n) {
  while (n) {
    ssize_t got = getrandom(out, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("getrandom: ") + std::strerror(errno));
    }
    out += got;
    n -= static_cast<size_t>(got);
  }
}

}  // namespace commlib
