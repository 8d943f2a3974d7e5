// Internal to the TCP transport (tcp*.cc): one peer's connections ("lanes"), its rings, parser
// state and control state, and the wire format.
//
// Striping (docs/transports.md): a peer pair has N lanes (COMMLIB_TCP_NCONNS, checked equal in the
// handshake). The DATA frames of each direction are numbered 0, 1, 2, ... in the order the caller
// publishes them, and frame s always travels on lane s % N. Each lane is one TCP stream, so it
// delivers its frames in order, and the receiver knows the sequence number of the next frame on
// every lane without any field on the wire: ring slot s % nslots, no reordering buffer. A frame is
// read only when its slot is free, so the ring never overflows. Control frames (CALL, FAIL) go on
// lane 0; CLOSE goes on every lane, so every stream ends with it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/tcp/tcp.h"

namespace commlib {

constexpr uint32_t kFrameMagic = 0x6d6c6263;  // "cblm"
enum FrameType : uint16_t { kFrameData = 1, kFrameCall = 2, kFrameFail = 3, kFrameClose = 4 };
constexpr size_t kMaxFailMessage = 1024;
constexpr uint32_t kMaxLanes = 16;  // COMMLIB_TCP_NCONNS range; also the width of the epoll tag's lane field

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

// A lane's receive staging buffer: a read that wants less than this goes through it (one recv
// takes a whole small frame, or several), a larger one goes straight to its destination (payloads
// of large chunks are not copied twice). Holds a 16 KiB chunk's frame whole.
constexpr size_t kStageBytes = (16 << 10) + kSendPrefix;

// One TCP connection of a peer pair. Send fields are guarded by the lane's send_mu, receive fields
// by Conn::recv_mu (lock recv_mu before any send_mu; several send_mu in lane order).
struct TcpTransport::Lane {
  uint32_t index = 0;
  std::atomic<int> fd{-1};
  bool attached = false;  // handshake done (set once, under connect_mu_ or by the progress thread)

  // Send side: the DATA frame with sequence number send_next (index, index + N, ...) is the next
  // this lane writes, write_off bytes of it written. Lanes have their own lock, so the caller's
  // thread and the progress thread write two lanes at once (the kernel's work per connection runs
  // in the writing thread: that is what striping spreads over cores).
  std::mutex send_mu;
  std::atomic<uint64_t> send_next{0};
  size_t write_off = 0;
  std::string control_out;  // control frames, written only between data frames
  size_t control_off = 0;
  bool writing_control = false;
  std::atomic<bool> want_write{false};  // the progress thread is to write this lane (handed off, or blocked)
  bool shut_write = false;

  // Receive side: the next DATA frame read here has sequence number recv_next.
  uint64_t recv_next = 0;
  // Bytes read from the socket ahead of the parser (stage[stage_off, stage_len)): small reads go
  // through here, so a small frame (header, chunk header, payload) costs one recv, not three.
  std::unique_ptr<char[]> stage{new char[kStageBytes]};
  size_t stage_off = 0, stage_len = 0;
  WireHeader hdr{};
  size_t hdr_got = 0;
  size_t body_got = 0;
  bool in_body = false;
  std::string control_in;
  char* landing = nullptr;  // where the current frame's payload goes when not into the ring
  bool torn = false;        // the posted receive was withdrawn mid-frame: drop the rest of it
  bool stalled = false;     // its next frame's ring slot is not free yet: not read, not watched
  bool got_close = false;   // this stream carried the peer's CLOSE: its end of stream is orderly
  uint32_t interest = 0;    // epoll events registered
};

struct TcpTransport::Conn {
  int peer = -1;
  int32_t pid = 0;
  size_t slot_stride = 0;
  std::vector<std::unique_ptr<Lane>> lanes;

  // Send ring: the caller fills slots at tail; slot s is written on lane s % N under that lane's
  // send_mu. A slot whose send_ref is set carries only the headers: its payload is written from
  // the caller's memory (zero-copy; the executor waits for send_head before that memory may
  // change). send_head = the lowest send_next of all lanes: every frame below it is in the kernel.
  std::vector<char> send_ring;
  std::vector<const char*> send_ref;  // per slot
  std::atomic<uint64_t> send_tail{0}, send_head{0};

  // Receive ring (slot = ChunkHeader + payload), frame s in slot s % nslots. recv_tail = the
  // lowest recv_next of all lanes: every frame below it is complete (the executor reads to there).
  std::vector<char> recv_ring;
  std::atomic<uint64_t> recv_tail{0}, recv_head{0};
  std::atomic<bool> rx_stalled{false};  // some lane waits for a slot: release_recv pokes the thread
  std::mutex recv_mu;  // the parsers, the posted receive and epoll interest (lock before send_mu)
  // The posted receive: the message the executor waits for next (its chunk j is frame first + j),
  // read straight into dst.
  struct Posted {
    bool active = false;
    CallDesc desc;
    char* dst = nullptr;
    size_t bytes = 0, chunk = 0;
    uint64_t first = 0;
  } posted;
  bool caller_reads = false;  // a waiting caller polls these sockets (TcpTransport::hold_reading)

  // Control state the executor reads.
  std::atomic<uint32_t> state{static_cast<uint32_t>(PeerState::Unknown)};
  std::mutex state_mu;
  ErrorKind fail_kind = ErrorKind::None;
  std::string fail_message;
  CallDesc call;
  bool has_call = false;

  uint32_t nlanes() const { return static_cast<uint32_t>(lanes.size()); }
  Lane& lane_of(uint64_t seq) { return *lanes[seq % lanes.size()]; }
  size_t send_slots() const { return send_ring.size() / slot_stride; }
  char* send_slot(uint64_t i) { return send_ring.data() + (i % send_slots()) * slot_stride; }
  const char*& send_ref_of(uint64_t i) { return send_ref[i % send_slots()]; }
  char* recv_slot(uint64_t i, size_t stride, uint32_t nslots) { return recv_ring.data() + (i % nslots) * stride; }
  bool any_fd() const {
    for (auto& l : lanes)
      if (l->fd.load() >= 0) return true;
    return false;
  }
};

// Handshake limits. An accepted connection must deliver its whole Hello within kHelloSeconds (a
// real rank sends it right after connecting) and finish within kHandshakeSeconds; at most
// kMaxPending wait at once, and a new one replaces the oldest unproven one (tcp_handshake.cc), so
// silent connections cannot keep a real rank out: it retries until its deadline (tcp_connect.cc).
constexpr size_t kMaxPending = 16;
constexpr double kHelloSeconds = 2.0;
constexpr double kHandshakeSeconds = 10.0;

// A connection accepted but not yet proven (progress thread only).
struct TcpTransport::Pending {
  int fd = -1;
  std::string from;  // peer address, for logs
  int stage = 0;     // 0: reading Hello, 1: reading Response
  Hello hello{};
  uint8_t nonce_s[32];
  char buf[sizeof(Hello)];
  size_t got = 0;
  double accepted_at = 0;
  double deadline = 0;  // first kHelloSeconds for the Hello, then the rest of kHandshakeSeconds
};

double monotonic_s();
bool valid_desc(const CallDesc& d);  // fields in range (peers are not trusted)

// epoll tags (data.u64): the kind in the top byte; for a lane, peer << 8 | lane below it.
constexpr uint64_t kTagListen = 1ull << 56, kTagEvent = 2ull << 56, kTagConn = 3ull << 56, kTagPending = 4ull << 56;
constexpr uint64_t kTagMask = 0xffull << 56;
inline uint64_t lane_tag(int peer, uint32_t lane) { return kTagConn | (static_cast<uint64_t>(peer) << 8) | lane; }

}  // namespace commlib
