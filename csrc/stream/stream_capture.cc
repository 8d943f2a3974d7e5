// The stream engine's capture mode (issue #37, item 3; docs/gpu.md "CUDA graphs"): a collective
// enqueued on a stream that is capturing (Device::capture_status, cudaStreamGetCaptureInfo) is
// recorded into the graph as its one kernel launch, so that every replay runs the call again.
//
// What a capture may not do, it cannot do here: allocate (cudaMalloc), upload a plan (a synchronous
// copy out of a staging area whose reuse is gated by an event query), query events, wait on an
// event of an eager call. So the call's plan, its scratch and input-staging buffers and the
// peers' mappings must exist from an eager call of the same shape (the warm-up), else the capture
// is refused with an error naming the missing warm-up, before anything is numbered or recorded.
// The launch reads every per-call counter on the device (kernels/plan_kernel.cuh), so replays
// interleave with eager calls; the plan is pinned for the graph's life (KernelPath::enqueue).
//
// The copy path refuses capture: its call check runs host functions that publish and compare
// per-call descriptors with numbers taken on the host at enqueue, which a replay would repeat
// stale; NCCL's own collectives (algorithm="nccl") are refused too.
//
// A one-sided call captured stages its buffers (a capture never agrees on a route): in the
// kernel path's staging arena when an eager call of its shape staged there since the arena last
// grew (KernelPath::arena_captures; the graph then holds the arena, which a later growth retires
// but never frees under it), else through the slots (refused by name where it does not fit).
//
// A captured call takes a call number when captured (every rank captures the same calls), none
// when replayed; it is not published on the control plane, has no completion event and no entry
// among the calls in flight (a replay is the graph's: ordering it with eager calls is the caller's
// streams' job, as for any graph), and its work is complete at once. The watchdog still watches
// replays, through the words the kernel writes at a replayed launch's start and end
// (watch_replays): a dead peer fails the engine, whose abort word releases the kernel.
#include "plan/lowering.h"
#include "stream/stream_engine.h"

namespace commlib {

namespace {

[[noreturn]] void refuse(int rank, const CollectiveCall& call, const std::string& why) {
  throw CommError("rank " + std::to_string(rank) + " cannot capture " + collective_name(call.coll) + " (" +
                  std::to_string(call.count) + " x " + dtype_name(call.dtype) + ") in a CUDA graph: " + why);
}

}  // namespace

uint64_t StreamEngine::capture_collective(const CollectiveCall& call, DeviceStream& s, CaptureStatus status,
                                          CallWork* work) {
  if (status == CaptureStatus::Invalidated)
    refuse(rank_, call, "the stream's capture was invalidated by an earlier error (end it and capture again)");
  if (call.algo == kNcclAlgorithmCode) refuse(rank_, call, "algorithm='nccl' does not capture here");
  if (call.codec.active()) refuse(rank_, call, "compress= runs on the copy path (copy_path_codec.cc), which refuses capture");
  if (path_of(call) != DeviceCallPath::Kernel)  // device auto's choice (policy/device_auto.h)
    refuse(rank_, call,
           std::string("it runs on the copy path, which refuses capture (") +
               (kernel_ ? "COMMLIB_DEVICE_PATH=auto sends calls above the kernel path's crossover there, or the peers "
                          "are not all on this host"
                        : "COMMLIB_DEVICE_PATH=copy") +
               "); use COMMLIB_DEVICE_PATH=kernel with every rank on one host");
  const size_t esize = dtype_size(call.dtype);
  auto key_of = [&](const ResolvedPlan& p) {
    const CallDesc shape = describe(call, p.algo, 0);  // enqueue_call's key, without a number
    return ScheduleKey{shape.coll, static_cast<uint8_t>(shape.algo & ~kDeviceCallAlgoBit), shape.root, shape.count,
                       static_cast<uint8_t>(esize)};
  };
  const ResolvedPlan* chosen = &plan_of(call, nullptr, DeviceRoute::Slots);  // captured calls stage through the slots
  // A captured call never agrees on a one-sided route (stream_one_sided.cc): an auto all_reduce
  // whose eager warm-up ran auto's choice for another route (every rank's buffers mapped, or
  // staged in the arena: policy/device_auto.h) has that plan, not the slots' choice, and takes it
  // on the staged path (refused by name where that does not fit the slots). Every rank's warm-up
  // agreed alike, so every rank holds the same plans.
  if (call.algo == 0 && !kernel_->has_plan(key_of(*chosen)) && one_sided_candidate(call, nullptr)) {
    for (const DeviceRoute route : {DeviceRoute::Mapped, DeviceRoute::Arena}) {
      const ResolvedPlan& warmed = plan_of(call, nullptr, route);
      if (warmed.one_sided && kernel_->has_plan(key_of(warmed))) {
        chosen = &warmed;
        break;
      }
    }
  }
  const ResolvedPlan& planned = *chosen;
  const ScheduleKey key = key_of(planned);
  // Staged: in the staging arena where it holds the call (kernel_path_arena.cc: the graph pins the
  // arena), else through the slots, which must fit it.
  if (planned.one_sided && kernel_->has_plan(key) && !kernel_->arena_captures(key)) kernel_->check_one_sided(key);
  const char* warm_up = "; run the same call once outside the capture first (the warm-up), then capture it";
  if (!kernel_->has_plan(key)) refuse(rank_, call, std::string("its device plan was never set up (no warm-up call)") + warm_up);
  const InputStaging staging = input_staging(call, rank_, size_);
  if (staging.kind != InputStaging::None && staging.elements * esize > input_copy_bytes_)
    refuse(rank_, call, std::string("its input staging buffer is not allocated yet (no warm-up call)") + warm_up);
  if (static_cast<size_t>(planned.sched.scratch_count) * esize > scratch_bytes_)
    refuse(rank_, call, std::string("its scratch buffer is not allocated yet (no warm-up call)") + warm_up);

  // From here on the call is numbered, as on every rank that captures it.
  const CallDesc desc = describe(call, planned.algo, control_->next_call_seq());
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lk(mu_);
    seq = ++seq_;
  }
  try {
    enqueue_call(call, planned, DeviceCallPath::Kernel, desc, esize, s, /*captured=*/true);
  } catch (const std::exception& e) {
    // The capture's error (it was invalidated meanwhile): nothing ran, the engine is unharmed.
    refuse(rank_, call, e.what());
  }
  // A work without an event: complete at once, nothing to wait for (the graph orders the call).
  if (work) *work = CallWork{Completion{}, seq};
  return 0;
}

void StreamEngine::watch_replays(std::unique_lock<std::mutex>& lk) {
  const auto check = [this] {
    using Clock = std::chrono::steady_clock;
    const auto now = Clock::now();
    if (!kernel_) return;
    KernelPath::ReplayWatch& w = kernel_->replay_watch;
    if (w.progress == Clock::time_point{}) w.progress = now;
    if (failed() || !kernel_->replay_running()) {
      w.progress = now;
      return;
    }
    if (kernel_->progress() != w.seen) {  // the replayed launch moved a chunk
      w.seen = kernel_->progress();
      w.progress = now;
    }
    std::string mismatch;  // the kernel's own descriptor check (a rank replaying another graph)
    if (kernel_->mismatch(&mismatch)) return fail(ErrorKind::Mismatch, mismatch);
    const std::string what = "a replayed graph's kernel-path collective (captured in a CUDA graph)";
    if (now - w.slow >= std::chrono::milliseconds(100)) {
      w.slow = now;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        const PeerStatus st = control_->peer_status(p, true);
        if (st.state == PeerState::Failed)
          return fail(st.kind == ErrorKind::None ? ErrorKind::Comm : st.kind,
                      "rank " + std::to_string(rank_) + " in " + what + ": rank " + std::to_string(p) + " failed: " + st.message);
        if (st.state == PeerState::Dead || st.state == PeerState::Closed)
          return fail(ErrorKind::Peer, gone_peer(p, st.state, what) + "; rank " + std::to_string(rank_) +
                                           " was waiting for its peers");
      }
    }
    if (std::chrono::duration<double>(now - w.progress).count() > opts_.timeout_s)
      fail(ErrorKind::Peer, "a peer made no progress for the timeout (COMMLIB_TIMEOUT, " + std::to_string(opts_.timeout_s) +
                                " s) during " + what + " on rank " + std::to_string(rank_));
  };
  lk.unlock();
  try {
    check();
  } catch (const std::exception& e) {  // a sticky device error: CommError, never terminate
    fail_device("the watchdog", e);
  }
  lk.lock();
}

}  // namespace commlib
