// The stream-ordered engine: runs the same schedules as the host executor (schedule/registry.h)
// on device buffers, through the device interface only (device/device.h). The host enqueues and
// returns; it never waits inside a collective.
//
// A call runs on one of three device paths behind one interface (stream/device_path.h): the copy
// path (stream/copy_path.h: chunks through peers' inboxes, counters in control regions), the
// kernel path (stream/kernel_path.h) or NCCL's own collective (stream/nccl_link.h); device auto
// (policy/device_auto.h) says which. The engine numbers calls (with the host calls), orders them,
// tracks them in flight, runs the watchdog and closes; point-to-point batches (stream_p2p.cc) take
// the point-to-point path (stream/p2p_path.h, behind the same interface: the copy path's chunks).
//
// A call on the copy path starts with its descriptor check (copy_path.h); a call on the kernel
// path checks inside its kernel (kernels/plan_call_check.cuh). Nothing enqueued on a stream waits on the host
// for another process, and host functions make no device or NCCL call (CUDA's rules: all host
// functions of a process may run on one thread; they must not call CUDA): they record an error,
// which the watchdog thread acts on (stream_watchdog.cc). A watchdog thread watches calls in
// flight: a peer that failed, died or closed, or a wait that makes no progress for the timeout,
// fails the engine with PeerError naming the rank and the call; it publishes the failure to the
// peers (control plane) and raises every counter this rank's stream waits on, so no stream stays
// blocked (again every watchdog tick while calls drain: a peer's stream running through its own
// failed call may still write a lower value into one of them). A call's completion is its done
// word (a kernel-path call: the word its kernel's last block stores, read by one host load, waited
// on by a stream with wait_value) or its event (every other call): stream/device_work.h. wait()
// makes a stream wait for the call, synchronize() waits on the host and raises the call's error.
// What an engine is made with: stream_engine_options.h; a call resolved once: prepared_call.h.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/errors.h"
#include "common/ring_queue.h"
#include "device/device.h"
#include "plan/call.h"
#include "plan/describe.h"
#include "plan/plan_cache.h"
#include "stream/copy_path.h"
#include "stream/device_link.h"
#include "stream/device_work.h"
#include "stream/event_pool.h"
#include "stream/nccl_link.h"
#include "stream/one_sided_scratch.h"
#include "stream/kernel_path.h"
#include "stream/p2p_descriptors.h"
#include "stream/p2p_path.h"
#include "stream/peer_control.h"
#include "stream/prepared_call.h"
#include "stream/remote_descriptors.h"
#include "stream/stream_engine_options.h"
#include "transport/transport.h"

namespace commlib {

class StreamEngine;

class StreamEngine : public std::enable_shared_from_this<StreamEngine>, private CopyPathHost,
                     private RemoteDescriptorsHost {
  friend class DeviceWork;
 public:
  // `plan`: the host communicator's plan context (rank, size, host map, overrides), so a device
  // call resolves auto exactly as a host call does.
  StreamEngine(std::shared_ptr<Device> device, std::unique_ptr<PeerControl> control, PlanContext plan,
               StreamEngineOptions opts);
  ~StreamEngine();

  // What the peers need to reach this rank (its control region and inbox); exchanged through
  // the store, then every rank calls connect() with all handles in rank order and the host of
  // every rank (the communicator's host map). connect() chooses the link of every pair
  // (stream/device_link.h: COMMLIB_DEVICE_LINK and the host map), then maps the control regions
  // and inboxes of the peers on this rank's host only (peer memory needs one machine); peers on
  // other hosts are reached over NCCL, their call descriptors exchanged in-band
  // (stream/remote_descriptors.h). NCCL's communicator itself is created afterwards, by every rank
  // together when needs_nccl() (commlib/device/nccl_comm.py).
  std::string local_handle() const;
  void connect(const std::vector<std::string>& handles, const std::vector<int>& host_of);
  DeviceLinkSetting link_setting() const { return opts_.link; }
  int64_t codec_piece_bytes() const { return opts_.codec_piece_bytes; }  // what a compressed call's codec carries
  // The link of this rank to every rank by name ("ipc", "nccl"; "" for itself, or before connect).
  std::vector<std::string> link_names() const;
  // Whether some pair of the world uses the nccl link (after connect).
  bool needs_nccl() const { return needs_nccl_; }
  // Peers whose control region this rank mapped (those on its host).
  int mapped_peers() const;

  // Enqueues the call on `stream`; calls on one engine execute in call order even across streams.
  std::shared_ptr<DeviceWork> collective(const CollectiveCall& call, DeviceStream& stream);
  // The same without a work handle (a blocking call through the bindings' cache: no allocation per
  // call, issue #37 item 2): the call's ordinal, complete once retired(ordinal); 0 for a call
  // captured in a graph (complete at once).
  uint64_t collective_unhandled(const CollectiveCall& call, DeviceStream& stream);
  // The same for a prepared call (prepare()): no plan lookup, no path decision per call.
  // `known_capture`: the stream's capture status as the caller asked it just before (the bindings'
  // wait for a buffer's own stream must know it: bindings/device_own_stream.cc), so the engine does
  // not ask again (one cudaStreamGetCaptureInfo per call); null: the engine asks.
  std::shared_ptr<DeviceWork> collective(const PreparedCall& call, DeviceStream& stream,
                                         const CaptureStatus* known_capture = nullptr);
  uint64_t collective_unhandled(const PreparedCall& call, DeviceStream& stream,
                                const CaptureStatus* known_capture = nullptr);
  // The same, re-arming `work` for this call instead of making a handle (no allocation: the
  // bindings' pool of handles no one else holds, issue #37 item 2; DeviceWork::rearm); returns the
  // call's ordinal as collective_unhandled does. A call that raises leaves `work` as it was.
  uint64_t collective_into(const PreparedCall& call, DeviceStream& stream, DeviceWork& work,
                           const CaptureStatus* known_capture = nullptr);
  // The engine retired every call up to ordinal `seq` (seen complete): one atomic load.
  bool retired(uint64_t seq) const { return retired_through_.load(std::memory_order_acquire) >= seq; }
  // Point-to-point messages (stream/stream_p2p.cc): the sends and receives of one batch run
  // concurrently; messages of a pair match in call order, checked (count, dtype) before a byte moves.
  // (`known_capture` as collective's)
  std::shared_ptr<DeviceWork> p2p(const std::vector<P2PItem>& items, DType dtype, DeviceStream& stream,
                                  const CaptureStatus* known_capture = nullptr);
  // An all_to_all with split sizes: the batch `items` (a send and a receive per peer,
  // core/p2p_plan.py's plan; `count`: the elements this rank sends), run as p2p runs it but
  // numbered as a collective (the communicator's next call number, taken when enqueued, after the
  // argument checks, on every rank alike and shared with host calls), so its errors name
  // "all_to_all #n" and the rank as every collective's do, not a message of the batch (issue #37);
  // its messages keep their numbers per pair.
  std::shared_ptr<DeviceWork> all_to_allv(const std::vector<P2PItem>& items, DType dtype, int64_t count,
                                          DeviceStream& stream, const CaptureStatus* known_capture = nullptr);
  // While the first device call waits for the peers' engines (a host rendezvous): publishes that
  // call as the next call of the communicator and raises MismatchError if a peer is in a host
  // call of that number, or the error of a peer (or of the host side) that failed.
  void check_first_call(const CollectiveCall& call);
  // The same while a first device call of point-to-point messages waits: a receive whose message
  // the peer sent from a host buffer (it is on the host link) raises MismatchError naming both.
  void check_first_p2p(const std::vector<P2PItem>& items, DType dtype);
  // The algorithm `call` runs on this engine (plan/plan_cache.h: as the host resolves it).
  std::string resolved_algorithm(const CollectiveCall& call);
  // `call` resolved (PreparedCall): the algorithm the kernel path's auto picks for it, if any, its
  // plan and its path (the bindings' call cache keeps it while tuning_generation() stays).
  PreparedCall prepare(const CollectiveCall& call);

  void abort(const std::string& reason);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // A device call of the engine's device threw (a sticky error): fails the engine and throws its
  // CommError.
  [[noreturn]] void device_error(const std::string& where, const std::exception& e);
  // Throws the engine's error if the call numbered `seq` was in flight (or later) when it failed.
  void throw_if_call_failed(uint64_t seq);
  // The engine's error if it failed a call (failed_from_seq_ <= the last call) and no caller was
  // told: no call, wait, synchronize or later call raised it, and neither the host side nor the
  // user aborted. Once: a second call returns false. The route's close() raises it (docs/gpu.md,
  // "A mismatched call writes nothing"), so a blocking call that failed last is never lost.
  bool take_unreported_error(ErrorKind* kind, std::string* message);
  // The engine's failure, asked without a call (ncclCommGetAsyncError's counterpart): true with the
  // error every later call would raise (PeerError naming the rank and the collective, MismatchError,
  // CommError) once the engine failed, told or not; false while healthy. For a graph's replays (no
  // work handle) before the next call. One atomic load while healthy; changes nothing.
  bool async_error(ErrorKind* kind, std::string* message);
  // Waits for every call (the watchdog still runs), stops the watchdog and closes the imports of
  // the peers' memory. Idempotent (a second caller returns once the first one finished); never
  // throws (a device error fails the engine instead). The host communicator's close runs it too.
  void close();
  // After close(): frees this rank's memory; the exported inbox only when `peers_closed` (every
  // peer closed its import: the Python side's barrier) and nothing failed. Idempotent.
  void release_memory(bool peers_closed);
  Device& device() { return *device_; }
  std::shared_ptr<Device> shared_device() const { return device_; }
  // NCCL: the `nccl` link's peers and algorithm="nccl" (stream/nccl_link.h); its communicator
  // is created by commlib/device/nccl_comm.py on first use.
  NcclLink& nccl() { return *nccl_; }
  // The path the last collective ran on: "kernel" (one launch, stream/kernel_path.h), "copy"
  // (copy-engine copies ordered by stream memory operations) or "" before the first.
  std::string last_path() const { return last_path_; }
  // The algorithm the last collective ran (auto resolved per call: a one-sided route may change
  // it, stream_one_sided.cc), "" before the first.
  std::string last_algorithm() const { return last_algorithm_; }
  // The kernel path (null with COMMLIB_DEVICE_PATH=copy): its record of the chunks it moved by
  // protocol, and the tests' hook on its chunk numbers (kernel_path.h).
  KernelPath* kernel_path() { return kernel_.get(); }
  // Lookups in the engine's plan cache so far (a prepared call's launches make none: issue #37).
  uint64_t plan_cache_lookups() const { return plans_.lookups(); }
  // Completion events the engine created so far (pooled: O(calls in flight), not one per call).
  uint64_t events_created() const { return events_ ? events_->created() : 0; }
  // Test hook: kernel-path calls are not published on the control plane, so only the kernel's own
  // descriptor check can find a mismatch (the watchdog's comparison of published calls cannot).
  void hide_kernel_calls_from_control_plane() { publish_kernel_calls_ = false; }

 private:
  struct InFlight {
    uint64_t seq = 0;  // the engine's ordinal of the call
    CallDesc desc;   // desc.seq: the communicator's call number (collectives; 0 for point to point)
    Completion done;
    bool recorded = false;  // `done` is set and enqueued (an event never recorded queries as complete)
    // The done word needs no device call (and no device guard); an event is queried.
    bool completed(Device& d) const;
  };

  // What a call's work handle is made of (DeviceWork's constructor or rearm): no allocation here.
  struct CallWork {
    Completion done;
    uint64_t seq = 0;
  };
  // collective()'s body: the call's ordinal, and its work into `*work` when asked (not null).
  // `prepared`: the call resolved already (null: resolve it now).
  uint64_t run_collective(const CollectiveCall& call, const PreparedCall* prepared, DeviceStream& s, CallWork* work,
                          const CaptureStatus* known_capture = nullptr);
  uint64_t enqueue_collective(const CollectiveCall& call, const PreparedCall* prepared, DeviceStream& s,
                              CallWork* work);
  // A call on a capturing stream (stream/stream_capture.cc): returns 0 (complete at once).
  uint64_t capture_collective(const CollectiveCall& call, DeviceStream& s, CaptureStatus st, CallWork* work);
  void watch_replays(std::unique_lock<std::mutex>& lk);  // the watchdog's tick (mu_ held) while graphs may replay
  // p2p's and all_to_allv's body: `a2av_count` (null: a plain batch) makes the batch the collective
  // all_to_all of that count, numbered as one.
  std::shared_ptr<DeviceWork> run_p2p(const std::vector<P2PItem>& items, DType dtype, DeviceStream& s,
                                      const CaptureStatus* known_capture, const int64_t* a2av_count);
  std::shared_ptr<DeviceWork> enqueue_p2p(const std::vector<P2PItem>& items, DType dtype, DeviceStream& s,
                                          const int64_t* a2av_count);

  CallDesc describe(const CollectiveCall& call, uint8_t algo, uint64_t seq) const;
  // Numbers a call, orders it after the previous one and starts its in-flight entry; finish()
  // sets its completion (the done word the launch returned when its launch is the call's last
  // operation, else an event recorded now: stream/device_work.h) and returns its work.
  void begin(const CallDesc& desc, DeviceStream& s);
  // The work only into `*work` when asked (not null); returns the call's ordinal.
  uint64_t finish(const Launched& launched, const std::string& enqueue_error, DeviceStream& s, CallWork* work);
  // Makes `s` wait for a call's completion: a stream wait on its done word, or on its event.
  void order_after(const Completion& c, DeviceStream& s);
  // The host waits for a call's completion (its word or its event). A done word that the engine's
  // failure left behind (the watchdog's abort releases a launch, which then exits and stores it;
  // only a launch that never ran does not) is waited for a bounded grace after the failure.
  void wait_done(const Completion& c);
  // An event that completes with `c`'s call: recorded on the engine's own stream after it waits
  // for the word (DeviceWork::completion_event: only when a caller asks).
  std::shared_ptr<DeviceEvent> event_after(const Completion& c);
  void throw_if_failed_locked();
  // Message descriptors (p2p_descs_, stream/p2p_descriptors.h): the watchdog's look for a device
  // receive whose message the peer sent from a host buffer, and the waits it looks at.
  void check_host_messages();
  void note_p2p_waits(const std::vector<std::pair<int, CallDesc>>& waits, bool add) override;

  // The launch's completion word (done_dev null where something follows the launch, e.g. avg's
  // divide, or the path has no word). `plan_slot`: a prepared call's (the kernel path's plan kept there).
  Launched enqueue_call(const CollectiveCall& call, const ResolvedPlan& plan, DeviceCallPath path, const CallDesc& desc,
                        size_t esize, DeviceStream& s, bool captured = false, const MappedPeers* mapped = nullptr,
                        KernelPlanSlot* plan_slot = nullptr);
  // The plan of `call`: the policy's (plans_), except where the kernel path's auto asks for another
  // algorithm on `route` (policy/device_auto.h: the cost model's choice, its index into
  // `*kernel_auto`; without a route: staged_route()), or where the policy's is host-engine only
  // (kHostOnly: the device's own choice, device_fallback_algorithm).
  const ResolvedPlan& plan_of(const CollectiveCall& call, uint8_t* kernel_auto = nullptr);
  const ResolvedPlan& plan_of(const CollectiveCall& call, uint8_t* kernel_auto, DeviceRoute route);
  // The route a call whose buffers are not mapped takes now: the staging arena while pool staging
  // is on (COMMLIB_DEVICE_STAGING=pool and every rank shares an arena), else the slots.
  DeviceRoute staged_route() const;
  KernelAutoInputs kernel_auto_inputs(DeviceRoute route) const;
  // stream_one_sided.cc: whether the ranks agree on `call`'s route before planning it (a one-sided
  // algorithm named, here or in `prepared`, or auto that would take the mapped two-shot where
  // every rank's buffers are mapped; decided from what every rank knows alike), and the agreement.
  bool one_sided_candidate(const CollectiveCall& call, const PreparedCall* prepared);
  // The route, in one_sided_ (refilled per call: no allocation in a steady state).
  const MappedPeers& agree_route(const CollectiveCall& call);
  // An eager staged one-sided call of shape `key` stages in the kernel path's arena (grown here,
  // alike on every rank, when too small: kernel_path_arena.cc); false: through the slots.
  bool staged_in_arena(const CollectiveCall& call, const ScheduleKey& key, DeviceStream& s);
  // `wait(stop)`, a host wait for every peer (stop: this engine or a peer failed): a peer's
  // failure raises as any call after it, another error names the collective, this rank and `what`.
  // A template (defined and used in stream_one_sided.cc only): the wait is called in place, no
  // std::function made of it per call (a lambda capturing the call's state is a heap allocation).
  template <class Wait>
  bool wait_for_peers(const CollectiveCall& call, const char* what, Wait&& wait);
  uint64_t one_sided_calls_ = 0;  // agree_route's call numbers (the same on every rank)
  OneSidedScratch one_sided_;     // agree_route's views and route, kept across calls (enqueue_mu_)
  // The path `call` runs on (policy/device_auto.h: device auto decides, the engine asks).
  DeviceCallPath path_of(const CollectiveCall& call) const;
  // compress=: the copy path (refusing what it cannot run)
  DeviceCallPath compressed_path(const CollectiveCall& call, const ResolvedPlan& planned, DeviceCallPath path) const;
  // CopyPathHost: what the copy path needs of the engine.
  void note_wait(const StreamWait& w) override;
  void publish_call(const CallDesc& desc) override { control_->publish_call(desc); }
  // Peers on other hosts (no control region mapped): their descriptors go over NCCL
  // (remote_descs_, stream/remote_descriptors.h).
  bool remote(int peer) const { return copy_->remote(peer); }
  // The peer's messages go in the NCCL group of the step, not chunk by chunk through its inbox.
  bool grouped(int peer) const { return copy_->grouped(peer); }
  char* grow(void*& buf, size_t& have, size_t bytes, DeviceStream& s);

  void watchdog_loop();
  void inspect_in_flight(bool slow);
  std::string describe_seq(uint64_t seq);
  // "rank p (pid n) died during <what>" ("closed the communicator" for a closed peer): how the
  // watchdogs and the one-sided agreement's wait name a peer gone mid-call (stream_watchdog.cc).
  std::string gone_peer(int p, PeerState state, const std::string& what) const;
  void fail(ErrorKind kind, const std::string& message, bool publish = true);
  // Every throw of the engine's error to a caller: notes that a caller was told (reported_).
  [[noreturn]] void raise_to_caller(ErrorKind kind, const std::string& message);
  // From a host function: only records the error (no device, NCCL or control-plane call there);
  // the watchdog fails the engine with it within a tick.
  // `seq`: the engine's number (seq_) of the call whose host function found the error, so that call
  // raises it even when its event completed before the watchdog acted (no default: a caller that
  // left it out let a mismatched receive complete without error under load).
  void fail_from_stream(ErrorKind kind, const std::string& message, uint64_t seq) override;
  // A device error (a sticky CUDA error, an injected fault): CommError here, PeerError for the
  // peers; never throws.
  void fail_device(const std::string& where, const std::exception& e);
  bool completed_or_failed(const InFlight& f);
  // Completed calls leave in_flight_ (oldest first; none once failed if `stop_if_failed`), each
  // event queried without mu_ so begin() never waits behind another thread's query (docs/gpu.md).
  void retire_completed(bool stop_if_failed);
  void fail_as(ErrorKind kind, ErrorKind published, const std::string& message, bool publish);  // f.completed(), a device error counting as done
  void release_waits();

  std::shared_ptr<Device> device_;
  std::unique_ptr<PeerControl> control_;
  const int rank_, size_;
  const StreamEngineOptions opts_;

  std::vector<std::unique_ptr<DeviceLink>> links_;  // per rank (null for this rank), set by connect()
  bool needs_nccl_ = false;
  bool connected_ = false, closed_ = false, released_ = false;
  std::shared_ptr<DeviceStream> own_stream_;  // frees at close

  int host_listener_ = 0;
  // Taken (exchanged for 0) by the first close(), outside close_mu_: the communicator holds its
  // listeners' lock while one runs close(), so the order is always that lock, then close_mu_.
  std::atomic<int> close_listener_{0};
  // Held through close(): a second caller (the host communicator closing on another thread)
  // returns only once nothing of the engine reaches the communicator any more.
  std::mutex close_mu_;
  // The host communicator closed (it may be gone): control_ is never called again.
  std::atomic<bool> host_gone_{false};
  int p2p_probe_ = 0;

  // Enqueue state (the caller's thread; one call at a time).
  std::mutex enqueue_mu_;
  uint64_t seq_ = 0;  // ordinal of the last call
  PlanCache plans_;  // resolved as the host communicator resolves (its context)
  Completion last_done_;  // the previous call's completion (its word or its event)
  // The stream the previous call was enqueued on (its native handle): a call on that same stream
  // is ordered after it by the stream itself and needs no wait (one driver call fewer per call,
  // issue #25); a call on another stream waits for last_done_ (its word or event). A handle cannot
  // name another stream while work on it is pending: CUDA frees a destroyed stream's resources
  // only once its work completed.
  void* last_done_stream_ = nullptr;
  std::unique_ptr<EventPool> events_;  // the completion events of calls without a done word (event_pool.h)
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  void* input_copy_ = nullptr;
  size_t input_copy_bytes_ = 0;

  // Shared with the watchdog and the stream's host functions.
  std::mutex mu_;
  std::condition_variable cv_;
  RingQueue<InFlight> in_flight_;  // (ring queues: no allocation per call in a steady state)
  RingQueue<StreamWait> waits_;
  std::atomic<bool> failed_{false};
  std::atomic<bool> reported_{false};  // the engine's error reached a caller (take_unreported_error)
  std::atomic<uint64_t> retired_through_{0};  // every call up to it retired (DeviceWork::known_complete)
  bool stream_failure_ = false;  // fail_from_stream's error, for the watchdog
  uint64_t stream_fail_seq_ = 0;  // the engine's number of the call that found it
  ErrorKind stream_fail_kind_ = ErrorKind::None;
  std::string stream_fail_message_;
  std::vector<void*> retired_;  // grown-out-of buffers, freed at close (no cudaFree mid-call)
  std::atomic<bool> give_up_{false};
  ErrorKind fail_kind_ = ErrorKind::None;
  std::string fail_message_;
  uint64_t failed_from_seq_ = 0;
  bool stop_ = false;
  // The watchdog sleeps without a tick (until a call or stop_) only after kParkAfter idle; begin() wakes it only then.
  bool watchdog_parked_ = false;
  std::chrono::steady_clock::time_point wd_last_progress_ = std::chrono::steady_clock::now();
  const void* wd_last_front_ = nullptr;
  uint64_t wd_last_target_ = 0;
  std::chrono::steady_clock::time_point wd_mismatch_seen_{};  // a kernel's mismatch record, first seen
  uint64_t wd_last_nccl_ = 0;  // NCCL calls the stream had entered at the last check
  std::thread watchdog_;
  const std::unique_ptr<NcclLink> nccl_;  // never null; carries nothing until set up
  std::unique_ptr<KernelPath> kernel_;    // null with COMMLIB_DEVICE_PATH=copy
  std::unique_ptr<CopyPath> copy_;        // never null (point-to-point runs on its chunks)
  std::unique_ptr<RemoteDescriptors> remote_descs_;  // never null; staging only with peers on other hosts
  std::unique_ptr<P2PDescriptors> p2p_descs_;        // never null (point-to-point message descriptors)
  std::unique_ptr<P2PPath> p2p_path_;                // never null (point-to-point batches: its chunks are copy_'s)
  std::string last_path_;
  std::string last_algorithm_;
  bool publish_kernel_calls_ = true;  // enqueue state
  uint64_t wd_kernel_progress_ = 0;
};

}  // namespace commlib
