// Shared-memory transport between processes on one host.
//
// One memory region per communicator (a memfd created by rank 0 and opened by the others through
// /proc/<pid>/fd, so no name ever exists in /dev/shm and a crash leaves nothing behind). It holds a
// control block per rank (doorbell futex, pid, state, failure message, current call) and one
// single-producer single-consumer ring of chunks per ordered pair of ranks. A sender copies into a
// chunk once; the receiver copies or reduces straight out of it.
//
// Waiting: a rank checks its channels, and when nothing moved spins briefly on its doorbell, then
// sleeps on it with FUTEX_WAIT; whoever publishes or frees a chunk for it bumps the doorbell and,
// only if it sleeps, wakes it. So 8 ranks on 2 cores do not burn the cores their peers need.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/link.h"
#include "transport/transport.h"

#include "common/params.h"

namespace commlib {

struct ShmConfig {
  uint32_t nslots = 4;          // chunks in flight per ordered pair
  uint64_t slot_bytes = 0;      // 0: chosen from the world size (see shm_default_slot_bytes)
  uint64_t stream_bytes = 0;    // each rank's broadcast stream (0: chosen from the world size)
  int64_t spin_us = kDefaultSpinUs;  // COMMLIB_SPIN_US (common/params.h)
};

uint64_t shm_default_slot_bytes(int size);
// Bytes of each rank's broadcast stream (SharedFlags' streams, transport.h): up to 4 MiB, so a root
// writes a 2 MiB broadcast (the size it serves best) and the next one without waiting for its
// readers (on 4 ranks, 2 cores, under load: 2 MiB broadcasts' medians 1.5-2x lower with 4 MiB than
// with 1-2 MiB); at most 16 MiB for all ranks together. Pages are touched only by a root's writes.
uint64_t shm_default_stream_bytes(int size);
// Bytes the region must have for `size` ranks under `cfg` (env COMMLIB_SHM_SLOT_BYTES,
// COMMLIB_SHM_SLOTS, COMMLIB_SHM_BCAST_BYTES override the defaults).
uint64_t shm_region_bytes(int size, const ShmConfig& cfg);
ShmConfig shm_config_from_env(int size);

class ShmTransport;
std::unique_ptr<SharedFlags> make_shm_flags(ShmTransport& t);  // shm_flags.cc

class ShmTransport final : public Transport {
 public:
  // Maps the region behind `fd` (rank 0 initialises the layout in place: it must be zero-filled).
  ShmTransport(int rank, int size, int fd, const ShmConfig& cfg);
  ~ShmTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t chunk_bytes() const { return slot_bytes_; }
  size_t channel_bytes() const { return nslots_ * slot_bytes_; }

  std::unique_ptr<Link> make_link(int peer) override;
  SharedFlags* shared_flags() override { return flags_.get(); }
  // With COMMLIB_CMA=1: checks that this process can read every peer's memory (process_vm_readv)
  // and, if so, tells the peers they may send it messages larger than a channel by rendezvous
  // (single copy). Call once every rank has mapped the region.
  bool enable_direct_reads() override;
  bool direct_reads() const { return direct_reads_; }  // this rank's own answer (kept privately)
  std::string direct_reads_reason() const override { return direct_reads_reason_; }

  uint32_t events() override;
  void wait_events(uint32_t seen, int64_t timeout_us) override;

  PeerStatus peer_status(int peer, bool check_process) override;
  bool peer_failed(int peer) override;
  void publish_failure(ErrorKind kind, const std::string& message) override;
  void publish_call(const CallDesc& d) override;
  bool peer_call(int peer, CallDesc* d) override;
  int peer_pid(int peer) override;
  void close() override;
  void wake() override { ring(rank_); }

  struct RankCtl;
  struct ChannelCtl;

 private:
  friend class ShmLink;
  friend class ShmFlags;
  RankCtl& ctl(int r) const;
  ChannelCtl& channel(int src, int dst) const;
  // Rank r's broadcast stream: its written position, then one line per reader with the position
  // that reader copied up to, then the ring's bytes (shm_flags.cc).
  std::atomic<uint64_t>& stream_produced(int r) const;
  std::atomic<uint64_t>& stream_consumed(int r, int reader) const;
  char* stream_data(int r) const;
  char* slot(int src, int dst, uint64_t index) const;
  void ring(int peer);

  int rank_, size_;
  uint32_t nslots_;
  uint64_t slot_bytes_, slot_stride_, channel_stride_;
  uint64_t stream_bytes_ = 0, stream_stride_ = 0;
  int64_t spin_us_;
  bool oversubscribed_ = false;
  char* base_ = nullptr;
  size_t bytes_ = 0;
  size_t ctl_offset_ = 0, chan_offset_ = 0, stream_offset_ = 0;
  bool closed_ = false;
  std::unique_ptr<SharedFlags> flags_;  // shm_flags.cc, over the control blocks
  bool direct_reads_ = false;  // this rank turned single-copy reads on (enable_direct_reads)
  std::string direct_reads_reason_;  // why not, when not
};

// One peer's pair of rings in the region (this rank -> peer, peer -> this rank), located once:
// each chunk operation is a few loads and stores on the ring and a doorbell ring, no lookups.
class ShmLink final : public Link {
 public:
  ShmLink(ShmTransport& t, int peer);
  ChunkHeader* acquire_send(char** payload) override;
  void publish_send() override;
  const ChunkHeader* peek_recv(const char** payload) override;
  void release_recv() override;
  void read_peer(void* dst, uint64_t remote, size_t bytes) override;
  void ack() override;
  uint64_t acked() override;

 protected:
  LinkCaps query_caps() const override;

 private:
  ShmTransport& t_;
  int peer_;
  ShmTransport::ChannelCtl& out_;  // this rank -> peer
  ShmTransport::ChannelCtl& in_;   // peer -> this rank
  char* out_slots_;
  const char* in_slots_;
  ShmTransport::RankCtl& peer_ctl_;
};

}  // namespace commlib
