// Runs one step of resolved operations over the links to its peers (a Fabric): every send and receive of the step
// progresses concurrently, chunk by chunk, so a large message streams through the bounded channel
// while the peer reduces what already arrived. Waits spin briefly, then sleep on the rank's
// doorbell (which every link rings); while asleep the executor watches for failed, closed, dead or silent peers and for
// peers inside a different collective.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <memory>
#include <vector>

#include "common/listener_list.h"
#include "host/ring_stores.h"
#include "policy/single_copy.h"
#include "policy/stream_stores.h"
#include "common/types.h"
#include "schedule/ir.h"
#include "transport/fabric.h"

namespace commlib {

struct ExecOp {
  OpKind kind = OpKind::Copy;
  int peer = -1;
  char* dst = nullptr;        // Recv/RecvReduce/Copy/Reduce
  const char* src = nullptr;  // Send/Copy/Reduce; RecvReduce: reduce from here into dst (null: dst)
  size_t bytes = 0;
  CallDesc desc;              // Send: stamped on chunks; Recv*: expected on chunks
  size_t done = 0;            // bytes moved so far
  bool finished = false;      // all chunks moved (a zero-byte message still moves one header)
  int8_t mode = -1;           // Send: -1 undecided, 0 copied through the channel, 1 rendezvous,
                              // 2 in place (the link writes from src; see LinkCaps::sends_in_place)
                              // Recv: 3 posted (the link may land chunks straight in dst)
  uint64_t rendezvous = 0;    // Send by rendezvous: the peer's ack count that completes it; in
                              // place: the link's ticket of the last chunk (0: not all published)
  size_t ready = SIZE_MAX;    // Send: bytes of src written so far (StepWork produces the rest while
                              // the step runs; whole chunks go as they are ready, never single-copy)
  int after = -1;             // set by run_step: the step's previous op of this direction with this
                              // peer (-1 none). A link carries a pair's chunks in order, so a message
                              // moves only once that one is all sent (received): op order (ir.h).
                              // run_lanes: the call's previous send to this peer in this lane
  uint32_t lane = 0;          // Send: stamped on chunks; Recv*: expected on chunks (the schedule lane
                              // of a laned call, else 0: docs/DESIGN.md "Laned calls")
};

// A laned call's steps for Executor::run_lanes: every step's ops in list order (each op's `lane`
// its step's), step s's in [begin[s], begin[s + 1]).
struct LanedSteps {
  std::vector<size_t> begin;  // steps + 1 entries
  std::vector<int> lane;      // per step
  int lanes = 1;              // W (schedule/lanes.h)
  int window = 0;             // Schedule::window
  std::vector<int> gate;      // per step: the step its intra window also waits for (-1 none; empty:
                              // no intra window: Schedule::intra_window, schedule/lanes.h)
};

// Work the caller interleaves with a step's transfers (the compressed lowering's codec: encoding
// the next piece of a send while earlier ones travel, decoding a received piece while later ones
// arrive). run() does one bounded piece of work and says whether it did any; the step ends once
// every transfer finished and run() has nothing left.
class StepWork {
 public:
  virtual bool run() = 0;

 protected:
  ~StepWork() = default;
};

struct ExecOptions {
  double timeout_s = 300.0;
  // A collective whose output buffers, all ranks together, hold at least this many bytes writes
  // its received messages and local copies with streaming stores (kernels/cpu_copy.h): the data
  // cannot stay in the cache anyway, and skipping the read-for-ownership of every destination line
  // saves a third of the memory traffic of a copy. 0: never. 32 MiB, the L3 of the VMs we measure
  // on (2 cores): there 16 MiB all_to_all and all_gather on 2 ranks and 8-16 MiB on 4 ranks were
  // 15-30% faster streaming, while calls whose outputs fit in L3 (8 MiB on 2 ranks, 4 MiB on 4)
  // were slower. (A VM's sysconf can report the host's L3, e.g. 384 MiB, so it is not derived from
  // it.) Point-to-point messages stream from this size on. COMMLIB_STREAM_BYTES overrides.
  size_t stream_bytes = size_t{32} << 20;
  // Collectives: the tuning file's "stream" entry of the call's collective and world size decides
  // where it has one (policy/stream_stores.h: measured per machine); the rule above where not. False
  // when COMMLIB_STREAM_BYTES is set: the rule alone.
  bool stream_tuned = true;
  // Chunk size of collectives that only move data (no reduction) on 4 or more ranks; 0: the
  // transport's (256 KiB). Measured on 2 cores, 16 MiB: all_to_all 4.2 -> 3.4 ms on 4 ranks and
  // 12.3 -> 9.3 ms on 8 with 64 KiB chunks (the chunks in flight between 4-8 ranks then stay in
  // cache), while all_reduce got 5-15% slower, and 2 ranks preferred 256 KiB for everything.
  // COMMLIB_COPY_CHUNK_BYTES overrides.
  size_t copy_chunk_bytes = size_t{64} << 10;
  // compress=: input bytes per coded piece (host/compressed_lowering.cc streams them); 0: whole
  // messages. COMMLIB_COMPRESS_PIECE_BYTES overrides.
  size_t codec_piece_bytes = size_t{256} << 10;
  // COMMLIB_CMA: when messages go single-copy (policy/single_copy.h decides per call from it).
  SingleCopySetting single_copy;
};

class Executor {
 public:
  Executor(Fabric& f, ExecOptions opts)
      : t_(f), opts_(opts), rendezvous_sent_(f.size(), 0), last_send_(f.size(), -1), last_recv_(f.size(), -1) {}

  // Runs `ops` to completion. `call` names the call in error messages (described only on failure:
  // building strings per call would show on the latency path).
  // Throws MismatchError / PeerError (after publishing the failure to the peers).
  void run_step(std::vector<ExecOp>& ops, DType dtype, RedOp op, const CallDesc& call, StepWork* work = nullptr);
  // Runs a laned call's steps with its lanes in flight (host/executor_lanes.cc, docs/DESIGN.md
  // "Laned calls"): a step starts once its lane's previous step and step i - window have finished;
  // chunks carry their lane and each peer's channel is taken apart by lane. Throws as run_step.
  void run_lanes(std::vector<ExecOp>& ops, const LanedSteps& steps, DType dtype, RedOp op, const CallDesc& call);
  // Steps of laned calls that finished while a step listed before them had not (the overlap the
  // lanes gave; 0 in list order). Read from any thread.
  uint64_t steps_ahead() const { return steps_ahead_.load(std::memory_order_relaxed); }
  // The most steps of one laned call under an intra window (Schedule::intra_window E) that ran at
  // once inside the host on this rank, over every call so far: at most E where the executor honours
  // the window (the steps it gates and their gates). Read from any thread.
  uint64_t intra_in_flight_max() const { return intra_in_flight_max_.load(std::memory_order_relaxed); }
  // Bytes of laned calls' messages that came before their step ran and were parked (copied aside,
  // landed when the step starts: the lanes' extra copy), and of those the single-copy messages read
  // when parked. Read from any thread.
  uint64_t parked_bytes() const { return parked_bytes_.load(std::memory_order_relaxed); }
  uint64_t parked_reads() const { return parked_reads_.load(std::memory_order_relaxed); }
  // The wait loops' work (run_step's and run_lanes' alike, every call): passes over the running
  // ops, those that moved nothing (a spin), and waits on the doorbell (each spins briefly, then
  // sleeps); how a laned call's time compares with list order's in counts (bench/laned_counts.py,
  // docs/DESIGN.md "Laned calls"). Read from any thread.
  struct WaitCounts {
    uint64_t passes = 0, idle_passes = 0, waits = 0;
  };
  WaitCounts wait_counts() const {
    return {passes_.load(std::memory_order_relaxed), idle_passes_.load(std::memory_order_relaxed),
            waits_.load(std::memory_order_relaxed)};
  }

  // Raises at once if a peer has already failed (used at the start of every call).
  void check_peers_failed(const CallDesc& call);

  // Called before a call's steps: `footprint_bytes` is what all ranks' outputs hold together (a
  // point-to-point batch: its largest message); decides whether this call streams its writes.
  // `chunk_cap` (0: the transport's chunk) caps the chunk size; both ends of a message must use
  // the same cap, so it may depend only on what every rank of the call agrees on.
  const ExecOptions& options() const { return opts_; }
  // A call's own timeout (torch's per-call `opts.timeout`), in force while that call runs in
  // place of the communicator's; 0: the communicator's. Calls run one at a time (the FIFO), so
  // the communicator sets it around each job (CallTimeout).
  void set_call_timeout(double seconds) { call_timeout_s_ = seconds; }
  double timeout_s() const { return call_timeout_s_ > 0 ? call_timeout_s_ : opts_.timeout_s; }
  // Names whose timeout a message means: the call's own or the communicator's.
  const char* timeout_owner() const { return call_timeout_s_ > 0 ? "the call's timeout" : "the communicator's timeout"; }

  // Probes asked, while a point-to-point receive waits, whether the peer sent that message on a
  // device buffer instead (the stream engine's, Communicator::add_p2p_probe): a mismatch.
  using P2PProbe = std::function<bool(int peer, const CallDesc& want, CallDesc* sent)>;
  int add_p2p_probe(P2PProbe fn) { return probes_.add(std::move(fn)); }
  void remove_p2p_probe(int id) { probes_.remove(id); }

  // `single_copy_min` (policy/single_copy.h): messages of at least this many bytes go single-copy
  // to peers that read this rank's memory directly; -1: none of this call's. Only the sender
  // decides (the receiver takes either form), so ranks need not agree on it.
  // Flag calls (flag_calls.cc): whether a broadcast of `bytes` fits the shared-memory flags (every
  // rank on this host), and the broadcast and barrier through them. Every rank must take the same
  // decision for a call (it depends only on the call and the communicator).
  bool flags_fit(size_t bytes) const;
  void flag_broadcast(const char* src, char* dst, size_t bytes, int root, const CallDesc& call);
  void flag_barrier(const CallDesc& call);
  // Waits until every peer's flag-call counter reached `counter` (a slot of this rank may then be
  // written again); the peers' counters are read again only when the last look does not cover it.
  void wait_peers_passed(uint64_t counter, size_t bytes, const CallDesc& call);
  // Flag exchanges (flag_calls.cc): auto's small all_gather, all_to_all, all_reduce and reduce_scatter
  // with every rank on this host, each rank's whole input written once into its slot and read by
  // every rank. `in_bytes` is a rank's input (flag_exchange_input_bytes, which flags_fit must take);
  // `block_bytes` a block of the output (all_gather, all_to_all: one per rank) or the output reduced
  // (`count` elements). -1 from flag_exchange_input_bytes: `c` is no exchange.
  static int64_t flag_exchange_input_bytes(Collective c, int64_t count, size_t esize, int size);
  void flag_exchange(Collective coll, const char* in, size_t in_bytes, char* out, size_t block_bytes, size_t count,
                     DType dtype, RedOp op, const CallDesc& call);
  // The "shared" broadcast through the root's stream (SharedFlags' streams), when every rank is on
  // this host and the transport has streams; the same on every rank of a call.
  bool stream_fits() const;
  // `stream`: the call streams (streams_call), as begin_call takes it.
  void stream_broadcast(const char* src, char* dst, size_t bytes, int root, const CallDesc& call, bool stream);

  // Whether a call streams its copies (policy/stream_stores.h stream_call): `tuned` is its plan's
  // "stream" entry (kStreamNoEntry: none, as for point-to-point), `call_bytes` auto's bytes and
  // `footprint_bytes` its outputs on every rank together. Every rank of a call decides alike.
  bool streams_call(int64_t tuned, int64_t call_bytes, size_t footprint_bytes) const {
    return stream_call(opts_.stream_tuned, tuned, call_bytes, footprint_bytes, opts_.stream_bytes);
  }
  void begin_call(bool stream, size_t chunk_cap = 0, int64_t single_copy_min = -1) {
    spin_ = true;
    stream_call_ = stream;
    if (stream) bump(streamed_calls_);
    chunk_cap_ = chunk_cap;
    single_copy_min_ = single_copy_min < 0 ? SIZE_MAX : std::max<size_t>(1, static_cast<size_t>(single_copy_min));
  }
  // Replaces begin_call's chunk cap for the rest of the call (the same rule: every rank alike).
  void set_chunk_cap(size_t chunk_cap) { chunk_cap_ = chunk_cap; }
  // Payload bytes of the messages this rank has sent to its peers (steps' sends, every link and
  // call, counted as each completes; compress=: the encoded bytes). Read from any thread.
  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  // Messages this rank sent single-copy (its peer read them from its buffer), as each is decided:
  // tests see which form the crossovers chose. Read from any thread.
  uint64_t single_copy_sends() const { return single_copy_sends_.load(std::memory_order_relaxed); }
  // Calls that wrote their copies with streaming stores (begin_call's and the shared broadcast's
  // decisions, counted as taken): tests see which way the "stream" entries and COMMLIB_STREAM_BYTES
  // sent a call. Read from any thread.
  uint64_t streamed_calls() const { return streamed_calls_.load(std::memory_order_relaxed); }

 private:
  // Messages under 64 KiB never stream: the fence would cost more than the cache lines it saves.
  static constexpr size_t kStreamMinBytes = size_t{64} << 10;
  bool streams(size_t message_bytes) const { return stream_call_ && message_bytes >= kStreamMinBytes; }
  // Messages from this size on go zero-copy where the link allows (sends written from the caller's
  // buffer, receives landed in it). Below it a copy costs less than the bookkeeping, and a copied
  // send completes at once, so small sends never wait for the peer to read.
  static constexpr size_t kInPlaceBytes = size_t{64} << 10;
  // One more of a wait counter (only the executor's thread writes them: no locked add).
  static void bump(std::atomic<uint64_t>& c) { c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
  bool progress(std::vector<ExecOp>& ops, DType dtype, RedOp op, const CallDesc& call, size_t* pending);
  struct LanedVectors;  // run_lanes' tables, kept across calls (executor_lanes.cc)
  struct LanedRun;      // run_lanes' state (executor_lanes.cc)
  bool progress_lanes(LanedRun& run, DType dtype, RedOp op, const CallDesc& call);
  void take_laned_chunk(LanedRun& run, int peer, const ChunkHeader* h, const char* payload, DType dtype, RedOp op,
                        const CallDesc& call);
  void start_laned_step(LanedRun& run, int step, DType dtype, RedOp op);
  void finish_laned_step(LanedRun& run, int step);
  void start_free_steps(LanedRun& run, DType dtype, RedOp op);  // those of run.ready that may start
  // Posts peer p's next receive to its link (lands in place) where nothing but it can come next.
  void post_laned_receive(LanedRun& run, int p, DType dtype);
  // Checks chunk `h` against receive `o` at byte `at` (`expect` bytes): a MismatchError naming both
  // messages unless it is that chunk of that message in that lane.
  void check_chunk(const ExecOp& o, const ChunkHeader* h, size_t at, size_t expect, const CallDesc& call,
                   const std::vector<ExecOp>& ops);
  // Fails (a CommError) on flag bits a chunk may not carry from `peer` (landed: this receive posted).
  void check_flags(const ChunkHeader* h, const Link& l, bool landed, int peer, const CallDesc& call);
  // Writes `n` received bytes of `payload` at byte `at` of receive `o` (copied, or reduced into dst).
  void deliver_bytes(ExecOp& o, size_t at, const char* payload, size_t n, DType dtype, RedOp op);
  bool progress_send(ExecOp& o, size_t esize);
  bool progress_send_in_place(ExecOp& o, Link& l, size_t cap);
  void post_receives(std::vector<ExecOp>& ops, DType dtype);
  void order_messages(std::vector<ExecOp>& ops);  // sets ExecOp::after
  // Leaves no link holding a pointer into the step's buffers (run_step's exit, also by exception).
  void release_buffers(std::vector<ExecOp>& ops);
  size_t chunk_for(const Link& l, size_t esize) const;
  // The step's Copy and Reduce ops (run_step decides when).
  void run_local_ops(ExecOp* begin, ExecOp* end, DType dtype, RedOp op);
  // `into` (a laned call's parked receive): the whole message read there as it is, not into o.dst.
  void receive_rendezvous(ExecOp& o, const char* payload, DType dtype, RedOp op, const CallDesc& call,
                          char* into = nullptr);
  void read_from_peer(ExecOp& o, Link& l, uint64_t address, DType dtype, RedOp op);
  // Sleeps on the doorbell until an event past `seen` or a slice (stall_clock.h); a wait that
  // outlasted its spin makes this call's later waits sleep at once (spin_).
  void sleep_on_events(uint32_t seen);
  void on_idle(std::vector<ExecOp>& ops, const CallDesc& call,
               std::chrono::steady_clock::time_point last_progress, bool slow_checks);
  [[noreturn]] void fail(ErrorKind kind, const std::string& message);
  void check_device_messages(const std::vector<ExecOp>& ops);  // fails if a probe says so
  // Copies send `o`'s next `n` bytes into a chunk's payload, plain or non-temporal as measured per
  // peer (chunk_stores.cc).
  void fill_chunk(const ExecOp& o, char* payload, size_t n);
  template <typename Ready>
  void wait_flags(Ready ready, OpKind kind, int only_peer, size_t bytes, const CallDesc& call);

  Fabric& t_;
  size_t chunk_cap_ = 0;
  size_t single_copy_min_ = SIZE_MAX;  // begin_call's single_copy_min (SIZE_MAX: never)
  bool stream_call_ = false;
  // Whether this call's waits still spin before they sleep (Fabric::wait_events). A call one of
  // whose waits outlasted a spin (nothing came from any peer for COMMLIB_TCP_SPIN_US) waits on a
  // slow link (a large message at 1 Gbit/s: a 512 KiB chunk every 4 ms), not on a peer's reply: its
  // later waits sleep at once. Spinning through each gave nothing and took the core from the
  // host's other threads: with 2 ranks a core, a training step's all_reduce thread spent 0.026 s of
  // CPU a step in spins (int8, 25.7 M gradients; docs/transports.md "Small-message latency").
  bool spin_ = true;
  ExecOptions opts_;
  double call_timeout_s_ = 0;  // set_call_timeout
  std::vector<uint64_t> rendezvous_sent_;  // per peer
  std::vector<int> last_send_, last_recv_;   // per peer: run_step's scratch for ExecOp::after (all -1 between steps)
  std::vector<char> bounce_;               // cache-sized staging for reductions of direct reads
  std::shared_ptr<LanedVectors> laned_kept_;  // run_lanes' tables between laned calls (made at the first)
  ListenerList<P2PProbe> probes_;
  uint64_t flag_calls_ = 0;       // flag calls made (numbered alike on every rank)
  std::vector<uint64_t> flag_writes_;     // per root: its flag broadcasts so far (its next slot: this mod slots)
  std::vector<uint64_t> flag_slot_call_;  // per slot of this rank: the counter every peer must pass before it is written again
  uint64_t flag_readers_done_ = 0;        // the lowest flag call every peer had completed, last looked at
  std::vector<uint64_t> stream_pos_;      // per root: where its last broadcast ended in its stream (flag_calls.cc stream_start)
  uint64_t stream_low_ = 0;               // the lowest position every reader had consumed of this rank's stream
  RingStores ring_stores_;                // plain or non-temporal stores into this rank's stream
  std::vector<RingStores> chunk_stores_;  // per peer: plain or non-temporal stores into its channel
  std::vector<ExecOp> ops_watched_;
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> single_copy_sends_{0};
  std::atomic<uint64_t> streamed_calls_{0};
  std::atomic<uint64_t> steps_ahead_{0};
  std::atomic<uint64_t> intra_in_flight_max_{0};
  std::atomic<uint64_t> parked_bytes_{0};
  std::atomic<uint64_t> parked_reads_{0};
  std::atomic<uint64_t> passes_{0}, idle_passes_{0}, waits_{0};  // wait_counts()
  // run_lanes: per op of the call, whether its step runs (on_idle judges peers by those only); null
  // outside it.
  const std::vector<uint8_t>* idle_running_ = nullptr;
};

// Sets a call's own timeout on the executor for the life of the scope (0: none).
struct CallTimeout {
  CallTimeout(Executor& e, double seconds) : exec(e) { exec.set_call_timeout(seconds); }
  ~CallTimeout() { exec.set_call_timeout(0); }
  CallTimeout(const CallTimeout&) = delete;
  CallTimeout& operator=(const CallTimeout&) = delete;
  Executor& exec;
};

}  // namespace commlib
