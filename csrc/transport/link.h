// The data plane between two ranks: a bounded channel of chunks in each direction. A Link is what
// NCCL calls a connector, and the one per-peer seam of the data plane: each transport provides
// its own link class (ShmLink, TcpLink, in transport/<kind>/) that moves chunks itself, with
// direct access to its channel; the executor fills send chunks in place and reads received chunks
// in place, never knowing which mechanism moves them. The domain-level duties (events, waiting,
// the control plane) stay with the Transport that made the link (transport.h).
//
// What a link can do is queried once, into LinkCaps, when the Fabric makes it (and again when
// this rank turns single-copy reads on), so the executor reads plain fields, not virtual calls,
// while it decides how to move each message.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/transport.h"

namespace commlib {

struct LinkCaps {
  size_t chunk_bytes = 0;    // payload capacity of one chunk (same at both ends)
  size_t channel_bytes = 0;  // bytes the channel buffers
  // Zero-copy sends: the link writes a chunk's payload from the caller's buffer (see Link).
  bool sends_in_place = false;
  // Posted receives: the link may write matching chunks straight into a posted destination.
  bool lands_in_place = false;
  // This rank turned single-copy reads on, so rendezvous chunks from the peer are welcome (a
  // rendezvous chunk makes us read the sender's memory at an address it chose).
  bool accepts_rendezvous = false;
  // The peer's own announcement that it reads this rank's memory directly (null: the link cannot
  // carry single-copy transfers). A live flag, not a cached answer: a peer announces it once it
  // has probed every rank, possibly after this rank's first calls, which go through the channel.
  const std::atomic<uint32_t>* peer_reads_flag = nullptr;
};

class Link {
 public:
  virtual ~Link() = default;

  const LinkCaps& caps() const { return caps_; }
  // Single-copy transfers: the peer can read this process's memory, so a message larger than the
  // channel may go as a rendezvous chunk (the receiver reads it, then acknowledges with ack()).
  bool peer_reads_directly() const {
    return caps_.peer_reads_flag && caps_.peer_reads_flag->load(std::memory_order_acquire) != 0;
  }
  // Queries the capabilities again (the Fabric calls it at creation and once direct reads are on).
  void refresh_caps() { caps_ = query_caps(); }

  // Send side: a free chunk to fill, or nullptr while the channel is full; publish makes it visible.
  virtual ChunkHeader* acquire_send(char** payload) = 0;
  virtual void publish_send() = 0;
  // Receive side: the oldest unread chunk, or nullptr; release frees it for the sender.
  virtual const ChunkHeader* peek_recv(const char** payload) = 0;
  virtual void release_recv() = 0;

  // Single-copy transfers (peer_reads_directly): read_peer copies `bytes` from address `remote`
  // of the peer into `dst`; the receiver acknowledges each rendezvous message it consumed with
  // ack(), the sender counts them with acked().
  virtual void read_peer(void* dst, uint64_t remote, size_t bytes);
  virtual void ack() {}
  virtual uint64_t acked() { return 0; }

  // Zero-copy sends (caps.sends_in_place): publish_send_in_place publishes the acquired chunk with
  // its payload left at `data`; that memory must not change until sends_completed() reaches the
  // returned ticket, or until detach_sends() copied what is still unsent into the link's own
  // buffer (an error path leaving before completion).
  virtual uint64_t publish_send_in_place(const char*) { return publish_send(), 0; }
  virtual uint64_t sends_completed() { return 0; }
  virtual void detach_sends() {}
  // Posted receives (caps.lands_in_place): the next message is `desc`, `bytes` long in chunks of
  // `chunk` bytes, and goes to `dst`; chunks that match exactly are read straight into dst and
  // arrive flagged kChunkLanded. unpost_recv withdraws dst (the link writes there no more).
  virtual void post_recv(const CallDesc&, char*, size_t, size_t) {}
  virtual void unpost_recv() {}

 protected:
  // What this link can do now (its transport's settings, this rank's direct-read state).
  virtual LinkCaps query_caps() const = 0;

 private:
  LinkCaps caps_;
};

// Only links with a peer_reads_flag receive rendezvous chunks (the executor refuses them otherwise).
inline void Link::read_peer(void*, uint64_t, size_t) {
  throw CommError("link: this link cannot read its peer's memory (its transport has no single-copy reads)");
}

}  // namespace commlib
