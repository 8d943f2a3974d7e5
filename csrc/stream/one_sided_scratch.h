// The one-sided calls' per-call scratch (stream_one_sided.cc, StreamEngine::agree_route): the
// agreement's views of the call's two buffers and the route made of them, kept by the engine across
// calls so that a steady mapped call makes no heap allocation (issue #37, item 1: docs/gpu.md "The
// one-sided calls' steady state"). Their vectors are sized (one entry per rank) at the first
// agreement and refilled in place at every later one; used under the engine's enqueue lock only, by
// one call at a time, and read by that call's launch before the next call refills them.
#pragma once

#include <chrono>

#include "device/peer_buffers.h"
#include "stream/device_path.h"

namespace commlib {

struct OneSidedScratch {
  PeerBufferView in, out;  // PeerBuffers::agree's answer for the call's input and output
  MappedPeers route;       // the call's route (agree_route's answer)
  const MappedPeers staged{};  // the route of a call that does not agree (never mapped)
  // When wait_for_peers last asked whether the peers' processes live (a peer that died or closed
  // publishes no failure): every kLivenessEvery while it waits, not at every spin.
  std::chrono::steady_clock::time_point liveness_at{};
  static constexpr std::chrono::milliseconds kLivenessEvery{100};
};

}  // namespace commlib
