// The data plane between two ranks: a bounded channel of chunks in each direction, the seam every
// transport (shm within a host, tcp across hosts, device links later) presents to the executor.
// A Link is what NCCL calls a connector: the executor fills send chunks in place and reads
// received chunks in place, never knowing which mechanism moves them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/transport.h"

namespace commlib {

enum class LinkKind : uint8_t { Self = 0, Shm = 1, Tcp = 2 };

inline const char* link_kind_name(LinkKind k) {
  switch (k) {
    case LinkKind::Shm: return "shm";
    case LinkKind::Tcp: return "tcp";
    default: return "self";
  }
}

class Link {
 public:
  virtual ~Link() = default;
  virtual LinkKind kind() const = 0;
  virtual size_t chunk_bytes() const = 0;    // payload capacity of one chunk (same at both ends)
  virtual size_t channel_bytes() const = 0;  // bytes the channel buffers

  // Send side: a free chunk to fill, or nullptr while the channel is full; publish makes it visible.
  virtual ChunkHeader* acquire_send(char** payload) = 0;
  virtual void publish_send() = 0;
  // Receive side: the oldest unread chunk, or nullptr; release frees it for the sender.
  virtual const ChunkHeader* peek_recv(const char** payload) = 0;
  virtual void release_recv() = 0;

  // Single-copy transfers (see Transport): only links whose peer can read this process's memory.
  virtual bool peer_reads_directly() { return false; }
  // This rank turned single-copy reads on, so rendezvous chunks from the peer are welcome (a
  // rendezvous chunk makes us read the sender's memory at an address it chose).
  virtual bool accepts_rendezvous() { return false; }
  virtual void read_peer(void* dst, uint64_t remote, size_t bytes) = 0;
  virtual void ack() = 0;
  virtual uint64_t acked() = 0;

  // Zero-copy sends and posted receives: see Transport.
  virtual bool sends_in_place() { return false; }
  virtual uint64_t publish_send_in_place(const char*) { return publish_send(), 0; }
  virtual uint64_t sends_completed() { return 0; }
  virtual void detach_sends() {}
  virtual bool lands_in_place() { return false; }
  virtual void post_recv(const CallDesc&, char*, size_t, size_t) {}
  virtual void unpost_recv() {}
};

// A Link onto one peer of a transport domain (a set of ranks one mechanism reaches: the ranks of
// this host for shm, every rank for tcp); `index` is the peer's rank inside that domain.
class DomainLink final : public Link {
 public:
  DomainLink(Transport& t, int index, LinkKind kind) : t_(t), index_(index), kind_(kind) {}
  LinkKind kind() const override { return kind_; }
  size_t chunk_bytes() const override { return t_.chunk_bytes(); }
  size_t channel_bytes() const override { return t_.channel_bytes(); }
  ChunkHeader* acquire_send(char** payload) override { return t_.acquire_send(index_, payload); }
  void publish_send() override { t_.publish_send(index_); }
  const ChunkHeader* peek_recv(const char** payload) override { return t_.peek_recv(index_, payload); }
  void release_recv() override { t_.release_recv(index_); }
  bool peer_reads_directly() override { return t_.peer_reads_directly(index_); }
  bool accepts_rendezvous() override { return t_.peer_reads_directly(t_.rank()); }
  void read_peer(void* dst, uint64_t remote, size_t bytes) override { t_.read_peer(index_, dst, remote, bytes); }
  void ack() override { t_.ack(index_); }
  uint64_t acked() override { return t_.acked(index_); }
  bool sends_in_place() override { return t_.sends_in_place(index_); }
  uint64_t publish_send_in_place(const char* data) override { return t_.publish_send_in_place(index_, data); }
  uint64_t sends_completed() override { return t_.sends_completed(index_); }
  void detach_sends() override { t_.detach_sends(index_); }
  bool lands_in_place() override { return t_.lands_in_place(index_); }
  void post_recv(const CallDesc& d, char* dst, size_t bytes, size_t chunk) override {
    t_.post_recv(index_, d, dst, bytes, chunk);
  }
  void unpost_recv() override { t_.unpost_recv(index_); }

 private:
  Transport& t_;
  int index_;
  LinkKind kind_;
};

}  // namespace commlib
