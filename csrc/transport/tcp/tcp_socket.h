// Socket plumbing for the TCP link: which local address to listen on (COMMLIB_SOCKET_IFNAME,
// COMMLIB_SOCKET_FAMILY, like NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY), address strings, socket
// options, and the fixed-size handshake messages with their checks.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "transport/tcp/hmac_sha256.h"

namespace commlib {

struct SockAddr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  std::string str() const;  // "10.0.0.1:4242" or "[fd00::2]:4242"
};

// The address to listen on. COMMLIB_SOCKET_IFNAME: comma-separated interface name prefixes
// ("eth,ens"), "^lo" excludes, "=eth0" matches exactly. COMMLIB_SOCKET_FAMILY: AF_INET or AF_INET6.
// Default: the first interface that is up and neither loopback nor docker, else loopback.
// Throws std::invalid_argument naming the variable when nothing matches.
SockAddr choose_listen_address();

// Parses "host:port" / "[v6]:port" (numeric hosts only: addresses come from peers, not names).
SockAddr parse_address(const std::string& s);

// TCP_NODELAY, keepalive and a user timeout so a vanished host errors out instead of hanging.
void tune_socket(int fd, double timeout_s);
void set_nonblocking(int fd);

// Handshake (fixed sizes, so every message is bounds-checked by construction):
//   connector -> acceptor  Hello      (who is calling whom in which communicator, nonce_c)
//   acceptor  -> connector Challenge  (nonce_s, MAC_accept: proves the acceptor holds the key)
//   connector -> acceptor  Response   (MAC_connect: proves the connector holds the key)
//   acceptor  -> connector Verdict    (accepted or not)
// Both MACs cover the communicator id, both ranks, the lane and lane count, and both nonces, with
// different labels, so
// neither can be replayed as the other. The key is derived from COMMLIB_SECRET and never sent;
// without a secret the key is empty and the exchange only checks that both ends agree.
constexpr uint64_t kHelloMagic = 0x31706374626c6d63ULL;  // "cmlbtcp1"
constexpr uint32_t kProtocolVersion = 3;  // 2: lanes (several connections per peer pair); 3: a schedule lane in every chunk header (ChunkHeader::lane)

struct Hello {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;  // sizeof(ChunkHeader): both ends must share the layout
  uint8_t comm_id[16];
  uint32_t from_rank, to_rank, world;
  int32_t pid;
  uint64_t chunk_bytes;
  uint8_t nonce[32];
  uint32_t lane, nlanes;  // which of the pair's connections this is, of how many (COMMLIB_TCP_NCONNS)
};

// An acceptor that refuses a Hello (another communicator, world size, chunk size or version) answers
// with a Challenge whose magic is this and whose nonce and mac carry the reason as text, so the
// connecting rank fails at once with it. A connection closed without one (evicted, timed out) is
// retried until the deadline.
constexpr uint64_t kRefusedMagic = 0x3066657262636d63ULL;  // "cmcbref0"

struct Challenge {
  uint64_t magic;
  int32_t pid;  // the acceptor's, for error messages
  uint32_t pad;
  uint8_t nonce[32];
  uint8_t mac[32];
};

struct Response {
  uint8_t mac[32];
};

struct Verdict {
  uint64_t magic;
  uint32_t accepted;  // 1 accepted, 0 refused, kVerdictLanesDiffer: proven, but COMMLIB_TCP_NCONNS differs
  uint32_t nlanes;    // the acceptor's COMMLIB_TCP_NCONNS
};
constexpr uint32_t kVerdictLanesDiffer = 2;

Digest handshake_mac(const std::string& key, const char* label, const Hello& h, const uint8_t nonce_s[32]);
void random_bytes(uint8_t* out, size_t n);

}  // namespace commlib
