// The shared-memory region's layout, private to the shm transport's files (shm.cc: channels,
// waiting and the control plane; shm_direct.cc: single-copy reads). Every field a peer polls sits
// on its own cache line, so that polling one does not bounce another.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/shm/shm.h"

namespace commlib {
namespace shm_layout {

// Bytes of one flag slot (SharedFlags): broadcasts up to this size go through them; and the slots
// per rank, so a root can write its next broadcasts before its readers copied the last one (with
// one slot every broadcast waited a round trip for its readers: 13 us instead of 1.1 us on 4 ranks).
// With 4 slots a root ran at most 4 calls ahead, so with more ranks than cores about one call in
// six of every rank waited for a peer to be scheduled (a median of 0.9-1.4 us per 8-byte broadcast
// at 4 ranks on 2 cores, against 0.6 us for Open MPI, whose shared-memory queues hold many
// messages); 32 make that wait rare (docs/transports.md "Flag calls"). 8 KiB a slot since session
// 38: auto's exchanges of 4-8 KiB inputs (all_reduce, all_to_all and reduce_scatter 8 KiB, all_gather
// 32 KiB at 4 ranks) then take the flags too, 0.71-0.95x the best schedule's time where they had run
// at 0.95-1.42x it (bench/RESULTS_collectives.md, session 38). 260 KiB per rank.
constexpr size_t kFlagSlotBytes = 8192;
constexpr int kFlagSlots = 32;
inline constexpr uint64_t kMagic = 0x636f6d6d6c696230ULL;  // "commlib0"
constexpr size_t kLine = 64;
constexpr size_t kMaxMessage = 1024;

struct RegionHeader {
  std::atomic<uint64_t> magic;
  uint32_t size;
  uint32_t nslots;
  uint64_t slot_bytes;
  uint64_t stream_bytes;
};

inline size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

}  // namespace shm_layout

using shm_layout::kFlagSlotBytes;
using shm_layout::kFlagSlots;
using shm_layout::kLine;
using shm_layout::kMagic;
using shm_layout::kMaxMessage;
using shm_layout::RegionHeader;
using shm_layout::round_up;

struct ShmTransport::RankCtl {
  alignas(kLine) std::atomic<uint32_t> doorbell;
  alignas(kLine) std::atomic<uint32_t> sleeping;
  // Written once (or when this rank fails), read by every peer at every call (check_peers_failed):
  // apart from `call`, which this rank writes at every call, or every call would miss on it.
  alignas(kLine) std::atomic<int32_t> pid;
  std::atomic<uint32_t> state;       // PeerState
  std::atomic<uint32_t> error_kind;  // ErrorKind, valid once state == Failed
  std::atomic<uint64_t> region_address;  // where this rank mapped the region (direct-read probe)
  std::atomic<uint32_t> reads_directly;  // 1: this rank reads peers' memory (rendezvous welcome)
  alignas(kLine) std::atomic<uint64_t> call_version;  // seqlock around `call`: odd while being written
  CallDesc call;
  char error_message[kMaxMessage];
  // SharedFlags (shm_flags.cc): the flag calls this rank completed, whether it waits for a flag
  // (peers ring it only then), and its slots.
  alignas(kLine) std::atomic<uint64_t> flags_completed;
  alignas(kLine) std::atomic<uint32_t> flags_waiting;
  struct FlagSlot {
    alignas(kLine) std::atomic<uint64_t> written;  // the flag call the slot holds
    uint64_t bytes;
    CallDesc desc;
    alignas(kLine) char data[kFlagSlotBytes];
  } flag_slots[kFlagSlots];
};

struct ShmTransport::ChannelCtl {
  alignas(kLine) std::atomic<uint64_t> tail;  // chunks published (written by the sender)
  alignas(kLine) std::atomic<uint64_t> head;  // chunks consumed (written by the receiver)
  alignas(kLine) std::atomic<uint64_t> acked;  // rendezvous messages read (written by the receiver)
};

}  // namespace commlib
