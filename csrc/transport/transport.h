// A transport domain: the ranks one mechanism reaches (shm: the ranks of one host; tcp: every rank
// of the communicator), with bounded per-peer channels of chunks (fill a send slot in place, read a
// received chunk in place), one event counter to sleep on, and the control plane for those peers
// (alive, closed, failed, which call they are in). The executor does not see a Transport: it sees
// one Link per peer (link.h) and the Fabric (fabric.h) that routes control per peer.
#pragma once

#include <cstdint>
#include <string>

#include "common/errors.h"

namespace commlib {

// What a rank is executing; carried by every chunk so a receiver detects mismatched calls.
struct CallDesc {
  uint64_t seq = 0;   // collective sequence number, or per-pair message number for send/recv
  uint8_t coll = 0;   // Collective
  uint8_t dtype = 0;  // DType
  uint8_t op = 0;     // RedOp (0 for collectives that do not reduce)
  uint8_t algo = 0;   // index in algorithms(coll) + 1; 0 when not applicable
  int32_t root = 0;
  int64_t count = 0;
  bool operator==(const CallDesc& o) const {
    return seq == o.seq && coll == o.coll && dtype == o.dtype && op == o.op && algo == o.algo &&
           root == o.root && count == o.count;
  }
  bool operator!=(const CallDesc& o) const { return !(*this == o); }
};

struct ChunkHeader {
  CallDesc desc;
  uint64_t offset = 0;  // byte offset of this chunk within the message
  uint64_t bytes = 0;   // payload bytes in this chunk (whole message for a rendezvous)
  uint32_t flags = 0;
};

// A rendezvous chunk carries no data, only the address of the sender's buffer (its payload is one
// uint64_t): the receiver reads the message straight from the sender's memory, then acknowledges.
constexpr uint32_t kChunkRendezvous = 1;
// Set by a receiving link (never accepted from the wire): this chunk's payload was already written
// to the destination the executor posted (post_recv), so there is nothing left to copy.
constexpr uint32_t kChunkLanded = 1u << 31;

enum class PeerState : uint32_t { Unknown = 0, Alive = 1, Closed = 2, Failed = 3, Dead = 4 };

struct PeerStatus {
  PeerState state = PeerState::Unknown;
  ErrorKind kind = ErrorKind::None;  // when Failed
  std::string message;               // when Failed (the peer's error) or Dead (why, if the link knows)
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual size_t chunk_bytes() const = 0;  // payload capacity of one chunk

  // Send side: a free chunk to fill, or nullptr while the channel to `peer` is full.
  virtual ChunkHeader* acquire_send(int peer, char** payload) = 0;
  virtual void publish_send(int peer) = 0;  // makes the acquired chunk visible and wakes `peer`

  // Receive side: the oldest unread chunk from `peer`, or nullptr.
  virtual const ChunkHeader* peek_recv(int peer, const char** payload) = 0;
  virtual void release_recv(int peer) = 0;  // frees it for the sender and wakes `peer`

  // Single-copy transfers (cross-memory attach). peer_reads_directly(p): p can read this rank's
  // memory, so large messages to p may go as rendezvous chunks. read_peer copies `bytes` from
  // address `remote` of `peer` into `dst`. The receiver acknowledges each rendezvous message it
  // consumed with ack(); the sender counts them with acked().
  virtual bool peer_reads_directly(int peer) = 0;
  virtual void read_peer(int peer, void* dst, uint64_t remote, size_t bytes) = 0;
  virtual void ack(int peer) = 0;
  virtual uint64_t acked(int peer) = 0;
  // Probe direct reads from every peer and, if they work, announce it (after all ranks mapped).
  virtual bool enable_direct_reads() { return false; }
  // Bytes a channel buffers; messages above it block the sender anyway, so they may rendezvous.
  virtual size_t channel_bytes() const = 0;

  // Zero-copy sends (links whose writer can read the caller's memory, tcp): publish_send_in_place
  // publishes the acquired chunk with its payload left at `data`; that memory must not change
  // until sends_completed(peer) reaches the returned ticket, or until detach_sends(peer) copied
  // what is still unsent into the link's own buffer (an error path leaving before completion).
  virtual bool sends_in_place(int) { return false; }
  virtual uint64_t publish_send_in_place(int peer, const char*) { return publish_send(peer), 0; }
  virtual uint64_t sends_completed(int) { return 0; }
  virtual void detach_sends(int) {}
  // Posted receives (tcp): the next message from `peer` is `desc`, `bytes` long in chunks of
  // `chunk` bytes, and goes to `dst`; chunks that match exactly are read straight into dst and
  // arrive flagged kChunkLanded. unpost_recv withdraws dst (the link writes there no more).
  virtual bool lands_in_place(int) { return false; }
  virtual void post_recv(int, const CallDesc&, char*, size_t, size_t) {}
  virtual void unpost_recv(int) {}

  // Waiting: read events() before checking for progress; wait_events() returns once it moved
  // (or after timeout_us), spinning briefly before it blocks.
  virtual uint32_t events() = 0;
  virtual void wait_events(uint32_t seen, int64_t timeout_us) = 0;

  // Liveness and failure propagation.
  virtual PeerStatus peer_status(int peer, bool check_process) = 0;
  virtual void publish_failure(ErrorKind kind, const std::string& message) = 0;
  virtual void publish_call(const CallDesc& d) = 0;         // the collective this rank is in
  virtual bool peer_call(int peer, CallDesc* d) = 0;        // false when none published
  virtual int peer_pid(int peer) = 0;
  virtual void close() = 0;  // marks this rank closed for its peers
  // Bumps this rank's own event counter (wakes wait_events): another domain's progress thread
  // calls it when something arrived there, so one rank sleeps on one counter for all its links.
  virtual void wake() = 0;
};

}  // namespace commlib
