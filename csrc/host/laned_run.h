// The state of one laned call on the host executor (Executor::run_lanes, executor_lanes.cc): its
// per-call tables, kept by the executor across calls, and the run around them. Private to
// executor_lanes.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "host/executor.h"

namespace commlib {

namespace {

bool is_recv(OpKind k) { return k == OpKind::Recv || k == OpKind::RecvReduce; }

// Whether every chunk of send `o` is on its link (executor.cc's rule).
bool all_posted(const ExecOp& o) { return o.finished || o.rendezvous != 0; }

enum : uint8_t { kWaiting = 0, kRunning = 1, kFinished = 2 };

}  // namespace

// run_lanes' per-call tables, kept by the executor across calls (Executor::laned_kept_): a call
// swaps them in, refills them in place and swaps them back, so a steady laned call allocates
// nothing (session 35: ~35 allocations a call, and one buffer per message that came early).
struct Executor::LanedVectors {
  std::vector<uint8_t> state;             // per step: kWaiting, kRunning, kFinished
  std::vector<int> lane_prev, lane_next;  // per step: its lane's previous and next step (-1 none)
  std::vector<int> wake;                  // per step: the step its intra window holds for it (-1 none)
  // Per step: one the intra window counts (a gated step, or the gate of one: the window's steps
  // inside the host, as far as it bounds them), and how many such steps run now.
  std::vector<uint8_t> windowed;
  std::vector<int> step_of;               // per op
  std::vector<size_t> left;               // per running step: its messages not finished
  std::vector<uint8_t> running;           // per op: its step runs (on_idle's mask)
  std::vector<int> active;                // the running steps
  std::vector<int> done;                  // steps whose last send just finished (progress_lanes)
  std::vector<int> ready;                 // steps that may have become free to start
  // Receives, per (peer, lane) at peer * W + lane: the call's, in list order, and which of them
  // takes that lane's next chunk from that peer.
  std::vector<std::vector<int>> recvs;
  std::vector<size_t> next_recv;
  std::vector<size_t> expected;  // per peer: receives not all taken off its channel
  std::vector<size_t> waiting;   // per peer: receives of running steps not all taken off it
  std::vector<int> from;         // the peers this rank receives from
  std::vector<size_t> arrived;   // per op: bytes taken off the channel
  std::vector<uint8_t> complete;                 // per op: all of it taken (a zero-byte message: its header)
  // What came before its receive's step ran: receive i's bytes at parked_at[i] of one buffer with
  // room for every receive of the call, kept across calls (reallocated only for a call receiving
  // more than any before; its pages are touched only where something parked).
  std::unique_ptr<char[]> parked;
  size_t parked_capacity = 0;
  std::vector<size_t> parked_at;
  std::vector<int> lanes_from;   // per peer: lanes with receives from it not all taken off its channel
  std::vector<int> posted;       // per peer: the receive posted to its link (-1 none; post_laned_receive)
  std::vector<int> last_lane, last_send;  // set-up scratch: per lane its last step, per (peer, lane) its last send
};

struct Executor::LanedRun : Executor::LanedVectors {
  LanedRun(std::vector<ExecOp>& o, const LanedSteps& s) : ops(o), steps(s), W(s.lanes) {}

  std::vector<ExecOp>& ops;
  const LanedSteps& steps;
  const int W;
  int windowed_running = 0;
  size_t finished = 0, first_unfinished = 0;
  // progress_lanes takes every chunk waiting in a channel this call still expects (parking what
  // runs later), not only those a running receive may be behind: the test seam park_eagerly only.
  bool park_all = false;

  size_t steps_count() const { return steps.lane.size(); }
  size_t op_begin(int s) const { return steps.begin[s]; }
  size_t op_end(int s) const { return steps.begin[s + 1]; }
  bool can_start(int s) const {
    const int D = steps.window;
    return state[s] == kWaiting && (lane_prev[s] < 0 || state[lane_prev[s]] == kFinished) &&
           (D <= 0 || s < D || state[s - D] == kFinished) &&
           (steps.gate.empty() || steps.gate[s] < 0 || state[steps.gate[s]] == kFinished);
  }
};

}  // namespace commlib
