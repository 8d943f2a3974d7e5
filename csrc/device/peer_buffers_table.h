// The layout of a rank's table of peers' buffers (device/peer_buffers.h): host memory (a memfd)
// its owner writes under seqlocks and the peers on its host map read-only. Private to
// peer_buffers*.cc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "device/peer_buffers.h"

namespace commlib {

namespace peer_table {
constexpr size_t kHandleBytes = 168;  // a CUDA handle in hex is 128 characters
}

struct PeerBuffers::Shared {
  std::atomic<uint64_t> retired;  // retirements so far: a peer that sees it move closes stale imports
  // Bit g: this rank reads no rank's kernel-path staging arena of generation g any more and closed
  // its imports of them (publish_arenas_done): its owner may free its own once every rank set it.
  std::atomic<uint64_t> arenas_done;
  // Nonzero once this rank's engine is closing (mark_closing): it makes no call any more, so a peer
  // waiting for its entry of a call stops (wait_entries) instead of waiting out the timeout.
  std::atomic<uint64_t> closing;
  char pad[40];
  struct Segment {  // 192 bytes
    std::atomic<uint64_t> seq;  // odd while written
    uint64_t id;                // buffer id; 0: free slot
    uint64_t bytes;
    char handle[peer_table::kHandleBytes];
  } segments[kSegments];
  struct Entry {  // a line
    std::atomic<uint64_t> seq;
    uint64_t call_plus_one;  // 0: never written
    uint64_t id, offset, slot;
    uint64_t bytes;  // the buffer's bytes from offset on that the call uses (RingTag::bytes)
    uint64_t pad[2];
  };
  // Two rings of the same layout, so that their call numbers never meet: lookup's (keyed by its
  // caller's numbers: the tests' binding, the symmetric pool's hits) and agree's (the engine's
  // one-sided calls and its staging arena's growths, numbered by the engine).
  Entry ring[kRing * kBuffersPerCall];
  Entry agreed[kRing * kBuffersPerCall];
};

}  // namespace commlib
