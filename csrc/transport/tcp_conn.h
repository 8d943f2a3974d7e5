// Internal to the TCP transport (tcp.cc, tcp_handshake.cc): one connection's rings, parser state
// and control state, and the wire format.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "transport/tcp.h"

namespace commlib {

constexpr uint32_t kFrameMagic = 0x6d6c6263;  // "cblm"
enum FrameType : uint16_t { kFrameData = 1, kFrameCall = 2, kFrameFail = 3, kFrameClose = 4 };
constexpr size_t kMaxFailMessage = 1024;

struct WireHeader {
  uint32_t magic;
  uint16_t type;
  uint16_t reserved;
  uint64_t length;  // body bytes
};
static_assert(sizeof(WireHeader) == 16, "wire header layout");

// A send slot holds a whole frame (WireHeader + ChunkHeader + payload) so one write() sends it,
// or only the headers when its payload is written from the caller's buffer (send_ref).
constexpr size_t kSendPrefix = sizeof(WireHeader) + sizeof(ChunkHeader);

struct TcpTransport::Conn {
  int peer = -1;
  std::atomic<int> fd{-1};
  int32_t pid = 0;
  size_t slot_stride = 0;

  // Send ring: the caller fills slots at tail; whoever holds send_mu writes them from head. A slot
  // whose send_ref is set carries only the headers: its payload is written from the caller's
  // memory there (zero-copy; the executor waits for send_head before that memory may change).
  std::vector<char> send_ring;
  std::vector<const char*> send_ref;  // per slot
  std::atomic<uint64_t> send_tail{0}, send_head{0};
  std::mutex send_mu;
  size_t write_off = 0;     // bytes of the frame at send_head already written
  std::string control_out;  // control frames, written only between data frames
  size_t control_off = 0;
  bool writing_control = false;
  std::atomic<bool> want_write{false};
  bool shut_write = false;

  // Receive ring (slot = ChunkHeader + payload): whoever holds recv_mu (the progress thread, or
  // a caller polling while it waits) fills it at tail.
  std::vector<char> recv_ring;
  std::atomic<uint64_t> recv_tail{0}, recv_head{0};
  std::atomic<bool> rx_stalled{false};
  std::mutex recv_mu;  // the parser, the posted receive and epoll interest (lock before send_mu)
  // The posted receive: the message the executor waits for next, read straight into dst.
  struct Posted {
    bool active = false;
    CallDesc desc;
    char* dst = nullptr;
    size_t bytes = 0, chunk = 0;
    size_t next = 0;  // offset the next chunk of it must carry
  } posted;
  char* landing = nullptr;  // where the current frame's payload goes when not into the ring
  bool torn = false;        // the posted receive was withdrawn mid-frame: drop the rest of it
  bool caller_reads = false;  // a waiting caller polls this socket (TcpTransport::hold_reading)
  // Parser.
  WireHeader hdr{};
  size_t hdr_got = 0;
  size_t body_got = 0;
  bool in_body = false;
  std::string control_in;
  uint32_t interest = 0;  // epoll events registered

  // Control state the executor reads.
  std::atomic<uint32_t> state{static_cast<uint32_t>(PeerState::Unknown)};
  std::mutex state_mu;
  ErrorKind fail_kind = ErrorKind::None;
  std::string fail_message;
  CallDesc call;
  bool has_call = false;
  bool got_close = false;

  size_t send_slots() const { return send_ring.size() / slot_stride; }
  char* send_slot(uint64_t i) { return send_ring.data() + (i % send_slots()) * slot_stride; }
  const char*& send_ref_of(uint64_t i) { return send_ref[i % send_slots()]; }
  char* recv_slot(uint64_t i, size_t stride, uint32_t nslots) { return recv_ring.data() + (i % nslots) * stride; }
};

// A connection accepted but not yet proven (progress thread only).
struct TcpTransport::Pending {
  int fd = -1;
  std::string from;  // peer address, for logs
  int stage = 0;     // 0: reading Hello, 1: reading Response
  Hello hello{};
  uint8_t nonce_s[32];
  char buf[sizeof(Hello)];
  size_t got = 0;
  double deadline = 0;
};

double monotonic_s();
bool valid_desc(const CallDesc& d);  // fields in range (peers are not trusted)

}  // namespace commlib
