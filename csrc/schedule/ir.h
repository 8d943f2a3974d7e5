// The schedule IR (docs/DESIGN.md): every collective algorithm is a pure function producing, for one
// rank, a list of steps; each step is a set of operations that may run concurrently. The same
// schedule is run by the executor (real bytes), the verifier (symbolic contributions) and the
// simulator (cost model).
//
// Buffers and the meaning of `count` per collective (P = size, all counts in elements; the code
// reads these shapes from one table, common/shapes.h):
//   all_reduce      input[count]            -> output[count]
//   all_gather      input[count]            -> output[P*count]   (block j = rank j's input)
//   reduce_scatter  input[P*count]          -> output[count]     (rank r gets block r reduced)
//   all_to_all      input[P*count]          -> output[P*count]   (out block j = rank j's in block r)
//   broadcast       input[count] (root)     -> output[count]
//   reduce          input[count]            -> output[count] (root only)
//   gather          input[count]            -> output[P*count] (root only)
//   scatter         input[P*count] (root)   -> output[count]
//   barrier         no data (count is 0)
// Buffers a rank does not own (output of reduce/gather off the root, input of broadcast/scatter off
// the root) must never be referenced by that rank's schedule.
//
// In-place calls alias the buffers; every schedule must be correct in both modes (the verifier
// checks both):
//   all_reduce, broadcast, reduce: output == input
//   all_gather: input == output + rank*count
//   reduce_scatter: output == input + rank*count
//   gather (root): input == output + root*count;  scatter (root): output == input + root*count
//   all_to_all has no aliased form (the executor copies the input aside first).
//
// Rules every builder follows (the verifier enforces them):
//   * ops of one step are independent: no op writes a region another op of the step reads or writes;
//   * the messages of one ordered pair match first in, first out: rank r's n-th send to q (by step,
//     then by op order within a step) is q's n-th receive from r, and their counts agree. A step may
//     hold several messages with one peer in one direction (schedules side by side do): they go and
//     are taken in op order, so send order = receive order (the device plan makes them one stream
//     of chunks per pair and step: kernels/device_plan.h);
//   * reductions happen in the same order on every rank that ends with a given element, so all ranks
//     end bitwise identical (IEEE add/mul are commutative, not associative);
//   * zero-count regions are allowed; a zero-count send still carries a header (it synchronises).
//
// One-sided operations (schedules over buffers every peer has mapped, trait kOneSided in
// registry.h): get/get_reduce read a region of a peer's buffer (the region is in the peer's
// layout), put writes one, reduce_to_all reads one region of every rank and writes one of every
// rank (the fused two-shot's block: reduced in registers, stored everywhere), reduce_from_all the
// same storing into this rank's only (the fused reduce_scatter's block); signal/wait order ranks. A step runs its waits first, then its data ops
// (get, get_reduce, put, copy, reduce, all concurrent), then its signals, so a signal releases what
// the step wrote or read. Flags model: every rank holds a counter per (signalling peer, tag); a
// signal adds one to the peer's counter, a wait consumes one (it waits until its counter passed the
// signals this rank consumed so far in the call), so a kernel runs them as release/acquire atomics
// on flags in mapped memory, and counters only grow across calls. The verifier proves, besides the
// results: no rank touches a peer's region unless the owner's signal ordered it after the owner's
// (and everyone's) earlier accesses, nobody overwrites a region a peer may still read, no peer
// touches a rank's buffers once that rank returned (its last waits order every peer's access
// first), every signal is waited for, and no wait is left hanging. A schedule uses one-sided ops or
// messages, never both.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/types.h"

namespace commlib {

enum class BufferId : uint8_t { Input, Output, Scratch };

struct Region {
  BufferId buf = BufferId::Input;
  int64_t offset = 0;  // elements
  int64_t count = 0;   // elements
};

enum class OpKind : uint8_t {
  Send,        // send(peer, src)
  Recv,        // recv(peer, dst): dst = incoming
  RecvReduce,  // recv_reduce(peer, dst[, src]): dst = src (op) incoming; no src (count 0): src = dst
  Copy,        // copy(dst, src)
  Reduce,      // reduce(dst, src): dst = dst (op) src
  Get,         // get(peer, dst, src): dst = the peer's src
  GetReduce,   // get_reduce(peer, dst, src): dst = dst (op) the peer's src
  Put,         // put(peer, dst, src): the peer's dst = src
  Signal,      // signal(peer, tag): after the step's data ops, one more on the peer's flag (this rank, tag)
  Wait,        // wait(peer, tag): before the step's data ops, consume one signal (peer, tag)
  // reduce_to_all(dst, src): every rank's dst = src of rank 0 (op) src of rank 1 ... (op) src of
  // rank P-1, in that order: this rank reads every rank's src once (its own locally, the peers' in
  // place) and stores the one result into every rank's dst (no peer: it touches every rank; the
  // regions are in every rank's layout alike). dst may alias src exactly (in place), never in part.
  ReduceToAll,
  // reduce_from_all(dst, src): this rank's dst = src of rank 0 (op) ... (op) src of rank P-1, in that
  // order: reduce_to_all storing into this rank's dst only (the fused reduce_scatter's block: every
  // rank's src read once, in place, the result written once). dst may alias src exactly, never in part.
  ReduceFromAll,
};

// Tags a signal or wait may carry (a kernel keeps size * kSignalTags flags per rank).
constexpr int kSignalTags = 8;

struct Op {
  OpKind kind = OpKind::Copy;
  int peer = -1;  // Send/Recv/RecvReduce and the one-sided ops but reduce_to_all / reduce_from_all
  Region dst;     // Recv/RecvReduce/Copy/Reduce/Get/GetReduce; Put: the peer's region
  Region src;     // Send/Copy/Reduce/Put; Get/GetReduce: the peer's region; RecvReduce optionally
  int tag = 0;    // Signal/Wait: which of the pair's kSignalTags flags
};

struct Step {
  std::vector<Op> ops;
  // The step's lane (schedule/lanes.h, docs/DESIGN.md "Lanes"): a step waits for its own lane's
  // previous step (in list order) and for the schedule's window, not for other lanes' steps. Lanes
  // are numbered 0..W-1; a schedule without lanes has every step in lane 0 (list order). The
  // verifier proves the lanes independent (a message's send and receive in one lane, so a pair's
  // messages match first in, first out per lane; no op of one lane writes what another lane's op
  // reads or writes), so running the list in order is one correct order among those the lanes allow.
  int lane = 0;
};

// Where region `r` starts among one rank's buffers, `bases` indexed by BufferId (input, output,
// scratch): addresses with `unit` the element size in bytes (the engines: plan/lowering.h,
// region_address), or element positions with unit 1 (the verifier's layout).
template <typename Base>
Base region_start(const Base* bases, const Region& r, int64_t unit = 1) {
  return bases[static_cast<int>(r.buf)] + r.offset * unit;
}

struct Schedule {
  std::vector<Step> steps;
  int64_t scratch_count = 0;  // elements of scratch the executor must provide
  // Steps in flight across lanes (schedule/lanes.h): 0, no bound but the lanes' (each lane runs on
  // by itself); D > 0, step i also waits for step i - D (list order) to have finished, so the steps
  // i, i + D, i + 2D, .. run one after another and at most D steps of a rank are in flight (as
  // NCCL_STEPS bounds a channel's slices), while a slow step holds back only its own lane and the
  // steps D after it. Meaningless without lanes (one lane runs one step at a time). Every rank's
  // schedule of a call has the same window.
  int window = 0;
  // Steps inside the host in flight (session 32, docs/simulator.md): 0, no bound but the window's;
  // E > 0, a step whose messages all stay inside its rank's host (the call's host map: lanes.h
  // intra_window_gates) also waits for the E-th such step listed before it to have finished, so at
  // most E of them run at once and the oldest first (the ports' work of old segments is not queued
  // behind new ones'), while the window keeps D steps of every kind in flight. Like the window it
  // only holds steps back (each waits for a step listed earlier); meaningless without lanes; every
  // rank of a call has the same.
  int intra_window = 0;
};

// How a call's schedule is composed: the registered algorithm and, for hierarchical, what runs in
// its phases (CollArgs below). The one value auto's policy chooses (AlgorithmChoice), its search
// ranks (candidate_search.h), the simulator plays and the plan cache builds
// (registry.h: build_schedule(args, composition)); nobody copies the fields one by one.
struct Composition {
  std::string algorithm;  // a registered name ("auto" only where a caller still has to resolve it)
  std::string inter;      // CollArgs::inter_algorithm
  std::string intra;      // CollArgs::intra_algorithm
  int64_t segment = 0;    // CollArgs::segment (elements; 0: not pipelined)
  int pieces = 0;         // CollArgs::pieces (0: the builder's own cap)
  int share = 0;          // CollArgs::share (0: the builder's default)
};

// Everything a builder may depend on. Nothing about bytes, dtypes or transports (only which
// ranks share a host).
struct CollArgs {
  Collective coll = Collective::AllReduce;
  int rank = 0;
  int size = 1;
  int64_t count = 0;
  int root = 0;
  // Host of every rank (any ids; ranks with equal ids share a host), for topology-aware
  // (hierarchical) schedules; empty: all ranks on one host. The other builders ignore it.
  std::vector<int> host_of;
  // Hierarchical schedules only (the others ignore both; the caller fills them, so every builder
  // stays a pure function of its CollArgs):
  //   inter_algorithm: the registered algorithm (same collective) the owners of each block run
  //     across hosts; empty: the built-in direct exchange between owners.
  //   intra_algorithm: the registered algorithm the ranks of each host run for the intra-host
  //     phases (all_reduce: a name registered for both reduce_scatter and all_gather; the others:
  //     for their intra collective, hierarchical_composed.cc); needs inter_algorithm; empty: the
  //     built-in direct exchanges.
  //   segment: elements per pipeline segment of all_reduce across two hosts or more (at most 16
  //     segments; rail_lanes: per lane, each lane's share cut in segments of this length); 0: not
  //     pipelined.
  //   pieces: all_reduce's overlapped pipeline cuts the lane with fewer talking steps into at most
  //     this many pieces per segment (hierarchical_overlap.cc); 0: the builder's own cap. rail_lanes
  //     (schedule/rail_lanes.cc) reads it as its lane count W instead (0: its default; lanes.h). The
  //     cost model's policy chooses it with the segment (policy/pipeline_shape.h).
  //   share: rail_split (schedule/side_by_side.h): the rail rings' share of the buffer in
  //     1/kShareUnits (the rest runs hierarchical with the fields above); 0: kDefaultShare.
  //     rail_halving and rail_lanes (schedule/rail_halving.cc) read it as their ramp instead: the
  //     first and last segment cut in share + 1 smaller ones (0: equal segments). The cost model's
  //     policy chooses it (policy/pipeline_shape.h).
  std::string inter_algorithm;
  std::string intra_algorithm;
  int64_t segment = 0;
  int pieces = 0;
  int share = 0;

  // Takes `how`'s hierarchical phases and segment (its algorithm is build_schedule's argument).
  void compose(const Composition& how) {
    inter_algorithm = how.inter;
    intra_algorithm = how.intra;
    segment = how.segment;
    pieces = how.pieces;
    share = how.share;
  }
};

// Helpers for builders.
inline Op op_send(int peer, Region src) { return Op{OpKind::Send, peer, Region{}, src}; }
inline Op op_recv(int peer, Region dst) { return Op{OpKind::Recv, peer, dst, Region{}}; }
inline Op op_recv_reduce(int peer, Region dst) { return Op{OpKind::RecvReduce, peer, dst, Region{}}; }
// dst = src (op) incoming: reduces straight out of another buffer (e.g. the input, saving an
// input->output copy out of place). In place src and dst are the same memory: plain recv_reduce.
inline Op op_recv_reduce_from(int peer, Region dst, Region src) { return Op{OpKind::RecvReduce, peer, dst, src}; }
inline bool reduces_from_src(const Op& o) { return o.kind == OpKind::RecvReduce && o.src.count > 0; }
inline Op op_get(int peer, Region dst, Region peer_src) { return Op{OpKind::Get, peer, dst, peer_src}; }
inline Op op_get_reduce(int peer, Region dst, Region peer_src) { return Op{OpKind::GetReduce, peer, dst, peer_src}; }
inline Op op_put(int peer, Region peer_dst, Region src) { return Op{OpKind::Put, peer, peer_dst, src}; }
inline Op op_signal(int peer, int tag) { return Op{OpKind::Signal, peer, Region{}, Region{}, tag}; }
inline Op op_wait(int peer, int tag) { return Op{OpKind::Wait, peer, Region{}, Region{}, tag}; }
inline Op op_reduce_to_all(Region dst, Region src) { return Op{OpKind::ReduceToAll, -1, dst, src}; }
inline Op op_reduce_from_all(Region dst, Region src) { return Op{OpKind::ReduceFromAll, -1, dst, src}; }
// The ops that read every rank's src (no peer named): reduce_to_all and reduce_from_all.
inline bool reads_every_rank(OpKind k) { return k == OpKind::ReduceToAll || k == OpKind::ReduceFromAll; }
inline bool is_message(OpKind k) { return k == OpKind::Send || k == OpKind::Recv || k == OpKind::RecvReduce; }
inline bool is_one_sided(OpKind k) { return k >= OpKind::Get; }
inline bool is_sync(OpKind k) { return k == OpKind::Signal || k == OpKind::Wait; }
// Whether an op of kind k names one peer (`peer`): the messages and the one-sided ops but
// reduce_to_all and reduce_from_all, which touch every rank.
inline bool names_peer(OpKind k) { return is_message(k) || (is_one_sided(k) && !reads_every_rank(k)); }
// Which regions an op names (the region a Get/GetReduce reads and a Put writes is the peer's).
inline bool op_has_dst(const Op& o) { return o.kind != OpKind::Send && !is_sync(o.kind); }
inline bool op_has_src(const Op& o) {
  return o.kind == OpKind::Send || o.kind == OpKind::Copy || o.kind == OpKind::Reduce || o.kind == OpKind::Get ||
         o.kind == OpKind::GetReduce || o.kind == OpKind::Put || reads_every_rank(o.kind) ||
         reduces_from_src(o);
}
// Whether any rank's step uses a one-sided op.
bool uses_one_sided(const Schedule& s);
inline Op op_copy(Region dst, Region src) { return Op{OpKind::Copy, -1, dst, src}; }
inline Op op_reduce(Region dst, Region src) { return Op{OpKind::Reduce, -1, dst, src}; }
inline Region in_region(int64_t off, int64_t n) { return Region{BufferId::Input, off, n}; }
inline Region out_region(int64_t off, int64_t n) { return Region{BufferId::Output, off, n}; }
inline Region scratch_region(int64_t off, int64_t n) { return Region{BufferId::Scratch, off, n}; }

const char* op_kind_name(OpKind k);
const char* buffer_name(BufferId b);

}  // namespace commlib
