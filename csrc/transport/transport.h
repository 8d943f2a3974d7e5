// A transport domain: the ranks one mechanism reaches (shm: the ranks of one host; tcp: every rank
// of the communicator), with bounded per-peer channels of chunks (fill a send slot in place, read a
// received chunk in place), one event counter to sleep on, and the control plane for those peers
// (alive, closed, failed, which call they are in). The executor does not see a Transport: it sees
// one Link per peer (link.h, made by the domain that reaches the peer) and the Fabric (fabric.h)
// that routes control per peer.
#pragma once

#include <cstdint>
#include <memory>
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
  // The schedule lane of the chunk's message (schedule/lanes.h; 0 in calls of one lane): a pair's
  // messages match first in, first out per lane, so a laned call's receiver takes each chunk for its
  // lane's next receive (docs/DESIGN.md "Laned calls"). In what was the header's padding.
  uint32_t lane = 0;
};
// Shared-memory slots and TCP frames hold the header as it is (TCP's handshake compares its size).
static_assert(sizeof(ChunkHeader) == 48, "the chunk header's layout is the shm slot's and the TCP frame's");

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

class Link;

// Small broadcasts and barriers through shared memory (shm_flags.cc): each rank owns one slot that
// every other rank of the domain reads, and one counter of the flag calls it completed. A broadcast
// is one write of the root's slot (data, then its call number) and one counter store per reader; a
// barrier is one counter store per rank. Calls are numbered alike on every rank (1, 2, ...), so a
// number says which call a slot or counter is at. Waking: every store rings the ranks that may wait
// for it (their doorbell), so the ordinary wait (spin, then futex) covers these too.
class SharedFlags {
 public:
  virtual ~SharedFlags() = default;
  virtual size_t max_bytes() const = 0;
  virtual int slots() const = 0;  // per rank: writes a root may have ahead of its slowest reader
  // The last flag call `rank` completed (its counter).
  virtual uint64_t completed(int rank) const = 0;
  // This rank completed flag call n; rings `wake` (kWakeAll: every peer; kWakeNone: no one) if it
  // is waiting (set_waiting).
  static constexpr int kWakeAll = -1;
  static constexpr int kWakeNone = -2;
  virtual void complete(uint64_t n, int wake) = 0;
  // Publishes this rank's slot `index` (0..slots()-1) as flag call n (bytes <= max_bytes) and rings
  // every waiting peer.
  virtual void write(int index, uint64_t n, const CallDesc& desc, const void* src, size_t bytes) = 0;
  // Whether `root`'s slot `index` holds flag call n; and its contents (valid until this rank
  // completes n: the root writes the slot again only after that).
  virtual bool holds(int root, int index, uint64_t n) const = 0;
  virtual const char* slot(int root, int index, CallDesc* desc, size_t* bytes) const = 0;
  // This rank is about to wait for a flag (on) or stopped waiting (off). Stores and rings are paired
  // so no wake is lost: a rank sets it before it reads its doorbell and checks its condition, and
  // complete/write store their counter before they look whether to ring. So a rank that waits
  // costs its peers a doorbell ring and one that does not costs them nothing: the common case of a
  // root running ahead of its readers, or of readers finding the data there, rings no one.
  virtual void set_waiting(bool on) = 0;

  // Large broadcasts (the "shared" algorithm, host/flag_calls.cc): each rank also owns a stream, a
  // ring of stream_bytes() that every other rank of the domain reads. Positions count bytes written
  // since the communicator began and only grow; byte p of a stream sits at p mod stream_bytes().
  // A root writes a broadcast once into its stream and publishes how far it wrote (produce); each
  // reader copies it out and publishes how far it read (consume); the root overwrites only what
  // every reader consumed. The stores ring the peers that wait (set_waiting), as the flags' do.
  virtual size_t stream_bytes() const { return 0; }  // 0: no streams
  virtual char* stream(int root) const = 0;
  virtual uint64_t produced(int root) const = 0;
  virtual void produce(uint64_t position) = 0;  // this rank's stream, up to `position`
  virtual uint64_t consumed(int reader) const = 0;  // of this rank's stream
  virtual void consume(int root, uint64_t position) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;  // this rank's index in the domain
  virtual int size() const = 0;  // ranks in the domain

  // The data plane to one peer (its index in the domain): a link of this transport's own class,
  // which moves chunks itself (link.h). The Fabric makes one per peer this domain reaches.
  virtual std::unique_ptr<Link> make_link(int peer) = 0;
  // Probe direct reads from every peer and, if they work, announce it (after all ranks mapped).
  virtual bool enable_direct_reads() { return false; }
  // Shared-memory flag calls between every rank of the domain (null: the transport has none).
  virtual SharedFlags* shared_flags() { return nullptr; }
  // Why direct reads are off after enable_direct_reads ("" when on, or when the domain has no
  // ranks to read), for the INFO log and comm.single_copy.
  virtual std::string direct_reads_reason() const { return ""; }

  // Waiting: read events() before checking for progress; wait_events() returns once it moved
  // (or after timeout_us), spinning briefly before it blocks.
  virtual uint32_t events() = 0;
  virtual void wait_events(uint32_t seen, int64_t timeout_us) = 0;
  // Bumps this rank's own event counter (wakes wait_events): another domain's progress thread
  // calls it when something arrived there, so one rank sleeps on one counter for all its links.
  virtual void wake() = 0;
  // A domain whose deliveries come through a progress thread rings `home` (the domain the rank
  // sleeps on) as well as its own counter.
  virtual void set_waker(Transport* home) { (void)home; }
  // Before the rank sleeps on `home`: a domain may make progress from the waiting thread for a
  // while (tcp polls its sockets), returning true once home's counter left `seen`.
  virtual bool spin_until(Transport& home, uint32_t seen) { return (void)home, (void)seen, false; }

  // Liveness and failure propagation.
  virtual PeerStatus peer_status(int peer, bool check_process) = 0;
  // Whether `peer` published a failure (peer_status's Failed), without building its message: asked
  // before every call (host/peer_checks.cc), so a transport that can answer cheaply says so.
  virtual bool peer_failed(int peer) { return peer_status(peer, false).state == PeerState::Failed; }
  virtual void publish_failure(ErrorKind kind, const std::string& message) = 0;
  virtual void publish_call(const CallDesc& d) = 0;         // the collective this rank is in
  virtual bool peer_call(int peer, CallDesc* d) = 0;        // false when none published
  virtual int peer_pid(int peer) = 0;
  virtual void close() = 0;  // marks this rank closed for its peers
};

}  // namespace commlib
