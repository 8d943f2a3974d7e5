// A communicator: its links (a Fabric: shm within the host, tcp across hosts), one executor, a
// cache of built schedules, and a FIFO of calls.
// Its definition is split along those seams: communicator.cc (life cycle and the work queue),
// plan_cache.cc (schedules built and cached per call shape), lowering.cc (a schedule's steps
// resolved to addresses and run on the executor), comm_options.cc (settings), describe.cc (describe_call, bounds-checked: codes come from peers).
//
// A blocking call whose queue is empty runs on the caller's thread (a hand-off to a sleeping
// worker would cost a futex wake-up on the latency path); asynchronous calls go to a worker thread
// started on first use. Either way calls execute one at a time, in call order. After any failure
// the communicator is aborted: queued and later calls fail at once with the same error.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/listener_list.h"
#include "common/types.h"
#include "host/comm_options.h"
#include "host/executor.h"
#include "plan/call.h"
#include "plan/plan_cache.h"
#include "schedule/ir.h"
#include "transport/fabric.h"

namespace commlib {
namespace sim {
struct Topology;
}


class Work {
 public:
  explicit Work(std::function<void()> job) : job_(std::move(job)) {}
  // Waits up to timeout_s (negative: forever). Returns false on timeout; rethrows the call's error.
  bool wait(double timeout_s);
  bool is_completed() const { return done_.load(std::memory_order_acquire); }

 private:
  friend class Communicator;
  void run();
  std::function<void()> job_;
  std::exception_ptr error_;
  std::atomic<bool> done_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

class Communicator {
 public:
  Communicator(std::unique_ptr<Fabric> fabric, CommOptions opts);
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // compress=: input bytes per streamed piece (COMMLIB_COMPRESS_PIECE_BYTES, read at creation).
  int64_t codec_piece_bytes() const { return static_cast<int64_t>(exec_.options().codec_piece_bytes); }
  // Payload bytes this rank's host executor has sent to peers (Executor::bytes_sent).
  uint64_t bytes_sent() const { return exec_.bytes_sent(); }
  // Messages this rank sent single-copy (Executor::single_copy_sends).
  uint64_t single_copy_sends() const { return exec_.single_copy_sends(); }
  // Calls that streamed their copies (Executor::streamed_calls).
  uint64_t streamed_calls() const { return exec_.streamed_calls(); }
  // Steps of laned calls that finished ahead of a step listed before them (Executor::steps_ahead).
  uint64_t steps_ahead() const { return exec_.steps_ahead(); }
  // The most intra-window steps of a laned call running at once on this rank (Executor::intra_in_flight_max).
  uint64_t intra_in_flight_max() const { return exec_.intra_in_flight_max(); }
  // What laned calls parked (Executor::parked_bytes, parked_reads).
  uint64_t parked_bytes() const { return exec_.parked_bytes(); }
  uint64_t parked_reads() const { return exec_.parked_reads(); }
  // The executor's wait loops: passes, passes that moved nothing, doorbell waits (Executor::wait_counts).
  Executor::WaitCounts wait_counts() const { return exec_.wait_counts(); }

  // Returns a Work for async calls; nullptr once a blocking call completed. `timeout_s` > 0: this
  // call's own timeout in place of the communicator's (torch's per-call opts.timeout).
  std::shared_ptr<Work> collective(const CollectiveCall& call, bool async, double timeout_s = 0);
  std::shared_ptr<Work> p2p(std::vector<P2PItem> items, DType dtype, bool async, double timeout_s = 0);
  // An all_to_all with split sizes: the point-to-point batch `items` (a send and a receive per
  // peer, core/p2p_plan.py's plan; `count`: the elements this rank sends), run as p2p runs it but
  // numbered as a collective (next_call_seq, taken when submitted on every rank alike), so a
  // failure names "all_to_all #n" and the rank, as every collective's does, not a message of
  // the batch (issue #37).
  // `timeout_s` > 0: the call's own timeout, as collective()'s (the torch backend's opts.timeout).
  std::shared_ptr<Work> all_to_allv(std::vector<P2PItem> items, DType dtype, int64_t count, bool async,
                                    double timeout_s = 0);
  // Receives `count` elements from whichever peer sends first (in FIFO order with other calls) and
  // writes that peer's rank to *source (host/recv_any.cc).
  std::shared_ptr<Work> recv_any(uintptr_t ptr, int64_t count, DType dtype, int32_t* source, bool async,
                                 double timeout_s = 0);

  // Called once every rank has joined: turns on single-copy transfers where the OS allows them.
  bool enable_direct_reads() { return transport_->enable_direct_reads(); }
  std::string direct_reads_reason() const { return transport_->direct_reads_reason(); }
  const Topology& topology() const { return topology_; }
  // The kind of transport that carries each rank ("self", "shm", "tcp"), by rank; kept after close().
  const std::vector<std::string>& link_kinds() const { return link_kinds_; }
  // What auto picks for `coll` of `bytes` on this communicator's links (policy/auto_policy.h).
  std::string auto_choice(Collective coll, int64_t bytes, int elem_bytes = 1) const;
  // Whether auto's `coll` of `bytes` runs as a flag call (host/flag_calls.cc) instead of
  // auto_choice's schedule: small broadcasts, barriers and exchanges (all_gather, all_to_all,
  // all_reduce, reduce_scatter) with every rank on this host.
  bool auto_runs_flag_call(Collective coll, int64_t bytes) const;
  // What an engine on this communicator resolves calls with (the stream engine takes a copy).
  const PlanContext& plan_context() const { return plans_.context(); }
  // The cost model auto ranks candidates with (COMMLIB_TOPOLOGY, set from Python before the first
  // call; its placement is replaced by this communicator's host map). Drops cached plans.
  void set_cost_model(const sim::Topology& model);
  bool has_cost_model() const { return plans_.context().cost_model != nullptr; }

  // The transport's control plane, for the stream engine's peer watch (stream/stream_engine.h).
  Fabric& transport() { return *transport_; }
  // False once close() released the links (transport() must not be used then).
  bool has_transport() const { return transport_ != nullptr; }

  // One call numbering for the host calls and the device calls (stream engine) of this
  // communicator, so that ranks mixing them differently get a MismatchError rather than a hang:
  // every collective takes its number in call order (host calls when submitted, device calls
  // when enqueued); point-to-point messages are numbered per pair (next_p2p_seq).
  uint64_t next_call_seq() { return call_seq_.fetch_add(1, std::memory_order_relaxed) + 1; }
  uint64_t peek_call_seq() const { return call_seq_.load(std::memory_order_relaxed) + 1; }
  // Publishes the call this rank is in on the control plane (the host executor and the stream
  // engine both do; serialised, and a lower number never replaces a higher one).
  void publish_call(const CallDesc& desc);

  // Failures shared with the stream engines of this communicator: fail_from_engine aborts the
  // host side with an engine's error (the engine has told the peers already); a listener hears of
  // every abort of the host side (once, possibly at once if it is already aborted).
  void fail_from_engine(ErrorKind kind, const std::string& message);
  int add_abort_listener(std::function<void(ErrorKind, const std::string&)> fn);
  void remove_abort_listener(int id);
  // A close listener runs once, when the communicator closes (close() or the destructor), before
  // its transport goes: a stream engine closes there (drains its calls, stops its watchdog),
  // since its works may keep it alive after the communicator, and nothing of it may reach the
  // transport after. remove_close_listener waits for a listener running on another thread.
  int add_close_listener(std::function<void()> fn);
  void remove_close_listener(int id);

  // Point-to-point messages of a pair share one numbering on host and device buffers (host
  // messages take their number when submitted, device messages when enqueued), so a host message
  // where the peer's message of that number is on a device buffer is a mismatch: the stream engine
  // looks at the host link's next message (peek_host_message, only while no host call runs) and
  // the executor asks the engine's probe (add_p2p_probe) for a device message of the number a host
  // receive waits for.
  uint64_t next_p2p_seq(int peer, bool send);
  // Each item's message number (next_p2p_seq's, per pair), taken when a batch is submitted; empty
  // while a receive from any source is queued (its batch numbers them when it runs).
  std::vector<uint64_t> p2p_seqs(const std::vector<P2PItem>& items);
  uint64_t peek_p2p_seq(int peer, bool send);  // the number next_p2p_seq would return
  bool peek_host_message(int peer, CallDesc* desc);
  int add_p2p_probe(std::function<bool(int peer, const CallDesc& want, CallDesc* sent)> fn);
  void remove_p2p_probe(int id);

  void close();
  void abort(const std::string& reason);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

 private:
  // A template so the blocking path (run inline when nothing is queued) wraps nothing in a
  // std::function: no per-call allocation on the latency path.
  template <typename Job>
  std::shared_ptr<Work> submit(Job&& job, bool async);
  // submit() for jobs built in other files (the template is defined in communicator.cc).
  std::shared_ptr<Work> submit_function(std::function<void()> job, bool async);
  void worker_loop();
  void run_collective(const CollectiveCall& call, uint64_t seq);
  // `seqs`: each item's message number, taken when submitted (empty: take them now, as a receive
  // from any source and the receives queued behind one do). `as_call`: the collective the batch is
  // (all_to_allv), which its errors name; null: the batch's own messages.
  void run_p2p(const std::vector<P2PItem>& items, DType dtype, const std::vector<uint64_t>& seqs = {},
               const CallDesc* as_call = nullptr);
  int wait_for_any_sender(DType dtype, int64_t count);
  // The call's resolved plan (plan/plan_cache.h), auto's choice logged once at debug >= 1.
  const ResolvedPlan& plan(const CollectiveCall& call, int64_t bytes);
  // compress=: the schedule's steps with every message encoded (host/compressed_lowering.cc).
  void run_compressed_steps(const CollectiveCall& call, const Schedule& sched, const CallDesc& desc,
                            char* const* bases);
  class CodecStep;  // compressed_lowering.cc: the codec's work inside a step
  char* scratch(size_t bytes);
  // Where a call goes instead of its schedule (lowering.cc flag_route): auto's small broadcast,
  // barrier or exchange through the shared-memory flags, or the "shared" broadcast through the root's
  // stream; None: the schedule.
  enum class FlagRoute : uint8_t { None, Barrier, Exchange, Broadcast, Stream };
  FlagRoute flag_route(const CollectiveCall& call, const ResolvedPlan& planned) const;
  // The decision itself, from what decides it (so auto_runs_flag_call answers as a call routes):
  // `auto_chose`, auto picked the algorithm (none named, no override, no codec); `shared_unencoded`,
  // the plan is the "shared" broadcast and the call has no codec; `flags_max`, the largest call
  // (count x esize) auto sends through the flags (policy/flag_cutoff.h, read with the plan).
  FlagRoute flag_route(Collective coll, int64_t count, size_t esize, bool auto_chose, bool shared_unencoded,
                       int64_t flags_max) const;
  void run_flag_call(const CollectiveCall& call, FlagRoute route, const CallDesc& desc, size_t bytes, bool stream);
  // A private copy of the input: premul_sum scales into it; in-place all_to_all reads from it.
  char* input_copy(size_t bytes);
  void record_failure(const CommError& e, ErrorKind kind);
  void fail_communicator(const CommError& e);  // abort after `e`, telling the peers
  void throw_if_aborted() const;

  std::unique_ptr<Fabric> transport_;
  Topology topology_;  // kept after close() for comm.topology
  std::vector<std::string> link_kinds_;
  Executor exec_;
  CommOptions opts_;
  int rank_, size_;

  // Point-to-point numbering per peer (next_p2p_seq); queued_any_: receives from any source
  // submitted and not yet run (they number at run time, and so do receives submitted behind them).
  std::mutex p2p_mu_;
  std::vector<uint64_t> send_seq_, recv_seq_;
  int queued_any_ = 0;
  // Execution state (touched only by the thread currently executing a call).
  PlanCache plans_;  // COMMLIB_ALGO_<COLLECTIVE> read at creation, the host map, the plans
  std::vector<ExecOp> ops_;
  // An in-place all_to_all's receives landed in scratch, copied to the output after the step (lowering.cc).
  struct Landed {
    char* dst;
    const char* from;
    size_t bytes;
  };
  std::vector<Landed> landed_;
  LanedSteps laned_;  // run_collective's steps of a laned call (reused: no allocation per call)
  std::unique_ptr<char[], void (*)(void*)> scratch_{nullptr, std::free};
  size_t scratch_bytes_ = 0;
  std::unique_ptr<char[], void (*)(void*)> input_copy_{nullptr, std::free};
  size_t input_copy_bytes_ = 0;
  // run_p2p's copy of the sends' single-copy crossover, and the tuning generation it was read at.
  int64_t p2p_single_copy_min(int64_t largest);
  SingleCopyCrossover p2p_crossover_;
  uint64_t p2p_crossover_generation_ = UINT64_MAX;
  std::vector<std::vector<uint8_t>> codec_msgs_;  // compress=: a step's encoded messages
  std::vector<uint8_t> codec_decoded_;            // compress=: a piece's encoding while it is projected
  std::vector<char> codec_incoming_;              // compress=: a received piece decoded, before the reduction
  std::vector<std::string> logged_auto_;

  // Queue.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Work>> queue_;
  bool busy_ = false, stop_ = false, closed_ = false;
  std::thread worker_;

  // Misuse guards (host/misuse.h): the fork generation this communicator was created under, and
  // the thread whose blocking call is in flight (none: default id).
  uint64_t fork_generation_;
  std::thread::id blocking_thread_;
  void forget_in_forked_child();

  std::atomic<uint64_t> call_seq_{0};  // the last number taken (next_call_seq)
  std::mutex publish_mu_;
  uint64_t published_seq_ = 0;
  // Held while they run (common/listener_list.h): remove_abort_listener waits for them; a close
  // listener (an engine closing) removes itself while it runs.
  ListenerList<std::function<void(ErrorKind, const std::string&)>> abort_listeners_;
  ListenerList<std::function<void()>> close_listeners_;

  std::atomic<bool> aborted_{false};
  ErrorKind abort_kind_ = ErrorKind::None;
  std::string abort_message_;
};

}  // namespace commlib
