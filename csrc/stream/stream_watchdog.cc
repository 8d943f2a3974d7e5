// The stream engine's failure side (see stream_engine.h): the watchdog thread, failing and
// releasing (works: device_work.cc and stream_works.cc; the copy path's descriptor check in copy_path.cc). The adapter from a host
// communicator to PeerControl is wired where both are known (bindings/peer_control.cc).
#include <chrono>
#include <cstdio>
#include <cstring>

#include "device/host_flags.h"
#include "stream/stream_engine.h"

namespace commlib {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kReleased = uint64_t{1} << 62;  // above any counter a stream waits for
constexpr auto kTick = std::chrono::milliseconds(20);
constexpr auto kSlowCheckEvery = std::chrono::milliseconds(100);
constexpr auto kMismatchGrace = std::chrono::milliseconds(300);  // see inspect_in_flight
constexpr auto kParkAfter = std::chrono::milliseconds(200);

}  // namespace

// -- failure ----------------------------------------------------------------------------------

void StreamEngine::throw_if_call_failed(uint64_t seq) {
  std::unique_lock<std::mutex> lk(mu_);
  // A host function of this call may have recorded an error (a descriptor mismatch) that the
  // watchdog has not acted on yet: it ran before the call's event completed, so the call must
  // raise it. Wait for the watchdog (bounded; it only takes the lock and aborts).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (stream_failure_ && !stop_ && std::chrono::steady_clock::now() < until)
    cv_.wait_for(lk, std::chrono::milliseconds(1));
  if (!failed()) return;
  if (seq >= failed_from_seq_) raise_to_caller(fail_kind_, fail_message_);
}

void StreamEngine::abort(const std::string& reason) {
  fail(ErrorKind::Comm, "rank " + std::to_string(rank_) + " aborted: " + reason);
  reported_.store(true, std::memory_order_release);  // the user's own abort: nothing to tell
}

void StreamEngine::note_wait(const StreamWait& w) {
  std::lock_guard<std::mutex> lk(mu_);
  waits_.push_back(w);
}

void StreamEngine::release_waits() {
  // The stop word before the kernel's abort word: a kernel that found a mismatch waits for the
  // abort, and what its stream runs after it (avg's divide, gated on the stop word as the stream
  // reaches it) must find the stop set once the kernel returns (aborting first, the divide ran on
  // a mismatched call now and then: tests/stream/test_mismatch_data.py's avg cases, 1 run in 6).
  copy_->release_waits();  // the stop word first, then the counters
  if (kernel_) kernel_->abort();  // every wait loop of a kernel polls it (after the stores above)
  // Message-descriptor waits are on the ring slots of this rank's region.
  std::lock_guard<std::mutex> lk(mu_);
  for (const StreamWait& w : waits_)
    if (w.what == WaitFor::MessageDesc) store_flag(const_cast<uint64_t*>(w.flag), kReleased);
}

bool StreamEngine::completed_or_failed(const InFlight& f) {
  if (f.done.word) return f.completed(*device_);  // one load: no device call, no guard
  try {
    DeviceGuard guard(*device_);
    return f.completed(*device_);
  } catch (const std::exception&) {
    return false;  // a device error: the call's data is not trustworthy
  }
}

void StreamEngine::retire_completed(bool stop_if_failed) {
  for (;;) {
    InFlight front;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (in_flight_.empty() || (stop_if_failed && failed())) return;
      front = in_flight_.front();  // holds its event (if any): the pool cannot hand it out meanwhile
    }
    if (!completed_or_failed(front)) return;
    std::lock_guard<std::mutex> lk(mu_);
    if (in_flight_.empty() || in_flight_.front().seq != front.seq) continue;  // another thread retired it
    in_flight_.pop_front();
    retired_through_.store(front.seq, std::memory_order_release);
    while (!waits_.empty() && waits_.front().seq <= front.seq) waits_.pop_front();
  }
}

void StreamEngine::fail(ErrorKind kind, const std::string& message, bool publish) {
  fail_as(kind, kind, message, publish);
}

void StreamEngine::fail_as(ErrorKind kind, ErrorKind published, const std::string& message, bool publish) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (failed_.load(std::memory_order_relaxed)) return;
    fail_kind_ = kind;
    fail_message_ = message;
    // Every call not yet complete fails (its data is incomplete); earlier ones stand.
    failed_from_seq_ = seq_ + 1;
    for (const InFlight& f : in_flight_) {
      if (!completed_or_failed(f)) {
        failed_from_seq_ = f.seq;
        break;
      }
    }
    // A host function's error belongs to its call, even if that call's event completed since.
    if (stream_fail_seq_ != 0 && stream_fail_seq_ < failed_from_seq_) failed_from_seq_ = stream_fail_seq_;
    failed_.store(true, std::memory_order_release);
  }
  give_up_.store(true, std::memory_order_release);
  if (publish && !host_gone_.load(std::memory_order_acquire)) {
    control_->publish_failure(published, message);
    control_->fail_host(kind, message);  // later host calls raise it at once
  }
  release_waits();  // no stream of this rank stays blocked
  try {
    nccl_->abort();  // nor one blocked inside NCCL
  } catch (const std::exception&) {
  }
  cv_.notify_all();
}

void StreamEngine::fail_from_stream(ErrorKind kind, const std::string& message, uint64_t seq) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stream_failure_ || failed_.load(std::memory_order_relaxed)) return;
    stream_failure_ = true;
    stream_fail_seq_ = seq;
    stream_fail_kind_ = kind;
    stream_fail_message_ = message;
  }
  cv_.notify_all();
}

void StreamEngine::fail_device(const std::string& where, const std::exception& e) {
  // This rank's device failed: CommError here; the peers hear of a failed peer (PeerError).
  fail_as(ErrorKind::Comm, ErrorKind::Peer,
          "rank " + std::to_string(rank_) + ": device error on " + device_->name() + " in " + where + ": " + e.what(),
          true);
}

void StreamEngine::device_error(const std::string& where, const std::exception& e) {
  fail_device(where, e);
  std::lock_guard<std::mutex> lk(mu_);
  raise_to_caller(fail_kind_, fail_message_);
}

// -- watchdog ---------------------------------------------------------------------------------

std::string StreamEngine::gone_peer(int p, PeerState state, const std::string& what) const {
  return "rank " + std::to_string(p) + " (pid " + std::to_string(control_->peer_pid(p)) + ") " +
         (state == PeerState::Dead ? "died" : "closed the communicator") + " during " + what;
}

std::string StreamEngine::describe_seq(uint64_t seq) {
  for (const InFlight& f : in_flight_)
    if (f.seq == seq) return describe_call(f.desc);
  return "call #" + std::to_string(seq);
}

void StreamEngine::watchdog_loop() {
  // The engine's device is this thread's current one before any device call (otherwise each
  // rank's watchdog would create a context on device 0).
  try {
    device_->make_current();
    // The watchdog queries events while the user's threads may capture graphs in global mode: its
    // queries concern eager calls only and must not invalidate those captures.
    device_->exchange_capture_mode(CaptureMode::Relaxed);
  } catch (const std::exception& e) {
    fail_device("the watchdog's set-up", e);
  }
  std::unique_lock<std::mutex> lk(mu_);
  auto last_slow = Clock::now();
  auto idle_since = Clock::now();  // when calls were last seen in flight
  while (!stop_) {
    if (stream_failure_) {  // a host function's error: acted on here, where device calls are allowed
      const ErrorKind kind = stream_fail_kind_;
      const std::string message = stream_fail_message_;
      lk.unlock();
      fail(kind, message);
      lk.lock();
      // Cleared only once fail() has marked the engine failed: a synchronize() that looked between
      // the two (the flag down, the engine not yet failed) returned as if the call had succeeded
      // (a mismatched receive completed with no error under load).
      stream_failure_ = false;
      cv_.notify_all();
      continue;
    }
    if (in_flight_.empty() && kernel_ && kernel_->captured_any() && !failed()) {
      cv_.wait_for(lk, kTick);  // graphs may be replayed at any time: never parked (stream_capture.cc)
      if (!stop_ && !stream_failure_ && in_flight_.empty()) watch_replays(lk);
      continue;
    }
    if (in_flight_.empty()) {
      // Parked only after a while without calls: while calls keep coming, begin() need not wake
      // it (a futex wake per call was the larger part of a small call's host time).
      if (Clock::now() - idle_since < kParkAfter) {
        cv_.wait_for(lk, kTick);
        continue;
      }
      watchdog_parked_ = true;
      cv_.wait(lk, [&] { return stop_ || stream_failure_ || !in_flight_.empty(); });
      watchdog_parked_ = false;
      continue;
    }
    idle_since = Clock::now();
    cv_.wait_for(lk, kTick);
    if (stop_) break;
    if (stream_failure_) continue;
    const auto now = Clock::now();
    const bool slow = now - last_slow >= kSlowCheckEvery;
    if (slow) last_slow = now;
    lk.unlock();
    try {
      inspect_in_flight(slow);
    } catch (const std::exception& e) {  // a sticky device error: CommError, never terminate
      fail_device("the watchdog", e);
    }
    lk.lock();
  }
}

void StreamEngine::inspect_in_flight(bool slow) {
  // Watchdog-thread state: when the stream last got past a wait.
  auto& last_progress = wd_last_progress_;
  auto& last_front = wd_last_front_;
  auto& last_target = wd_last_target_;
  retire_completed(false);
  std::unique_lock<std::mutex> lk(mu_);
  while (!waits_.empty() && load_flag(waits_.front().flag) >= waits_.front().target) waits_.pop_front();
  const auto now = Clock::now();
  if (failed() && !in_flight_.empty()) {
    // Peers' streams, running through their own failed calls, still write this rank's counters
    // with ordinary values and may lower a released one under a target: raise them again until
    // every call has drained.
    lk.unlock();
    release_waits();
    return;
  }
  if (in_flight_.empty() || failed()) {
    last_progress = now;
    return;
  }
  std::string kernel_mismatch;  // a kernel's own descriptor check (kernels/plan_call_check.cuh)
  if (kernel_ && kernel_->mismatch(&kernel_mismatch)) {
    // A peer that fails inside a call can leave another peer already past it (it had that peer's
    // part) while this rank still waits for the failed one: the kernel's check then sees a later
    // call and records a mismatch. The failure explains it and is what the caller must hear, so a
    // record waits up to kMismatchGrace for a peer's failure to appear on the control plane.
    const CallDesc stuck = in_flight_.front().desc;
    lk.unlock();
    for (int p = 0; p < size_; ++p) {
      const PeerStatus st = p == rank_ ? PeerStatus{} : control_->peer_status(p, false);
      if (st.state == PeerState::Failed)
        return fail(st.kind == ErrorKind::None ? ErrorKind::Comm : st.kind,
                    "rank " + std::to_string(rank_) + " in " + describe_call(stuck) + ": rank " + std::to_string(p) +
                        " failed: " + st.message);
    }
    if (wd_mismatch_seen_ == Clock::time_point{}) wd_mismatch_seen_ = now;
    if (now - wd_mismatch_seen_ < kMismatchGrace) return;
    return fail(ErrorKind::Mismatch, kernel_mismatch);
  }
  // Where the stream is: the first wait not yet satisfied, or (none: every data wait of the
  // calls in flight is satisfied, so it sits in a call's descriptor check) the oldest call.
  const StreamWait* front = waits_.empty() ? nullptr : &waits_.front();
  const uint64_t seq = front ? front->seq : in_flight_.front().seq;
  const void* where = front ? static_cast<const void*>(front->flag) : static_cast<const void*>(&in_flight_.front());
  const uint64_t target = front ? front->target : seq;
  if (where != last_front || target != last_target) {
    last_progress = now;
    last_front = where;
    last_target = target;
  }
  if (kernel_ && kernel_->progress() != wd_kernel_progress_) {  // a kernel call moved a chunk
    wd_kernel_progress_ = kernel_->progress();
    last_progress = now;
  }
  // Host and device calls share one numbering: a peer's host call of a number a device call of
  // this rank has is a mismatch (the host call never reaches this rank's stream).
  std::vector<CallDesc> calls;
  for (const InFlight& f : in_flight_)
    if (f.desc.coll != static_cast<uint8_t>(Collective::Send)) calls.push_back(f.desc);
  const int waited_peer = front ? front->peer : -1;
  const bool desc_wait = front && front->what == WaitFor::CallDesc;
  const char* doing = !front ? "" : front->what == WaitFor::MessageDesc ? "receive (its descriptor) from"
                                   : front->send                       ? "send to"
                                                                       : "receive from";
  const std::string what = describe_seq(seq);
  uint64_t stuck_call = 0;  // the communicator's number of the call the stream is in (0: point to point)
  for (const InFlight& f : in_flight_)
    if (f.seq == seq) stuck_call = f.desc.seq;
  lk.unlock();

  // NCCL: an asynchronous error (its own threads found a network or remote failure) fails the
  // engine, whose abort (ncclCommAbort) releases a stream blocked inside NCCL; and where the
  // stream is blocked when it sits inside an NCCL call (NCCL moving on counts as progress).
  std::string nccl_why, nccl_where;
  if (const int code = nccl_->async_error(&nccl_why))
    return fail(code == kNcclRemoteError ? ErrorKind::Peer : ErrorKind::Comm,
                "rank " + std::to_string(rank_) + " in " + what + ": NCCL reported an asynchronous error: " + nccl_why);
  uint64_t nccl_entered = 0;
  const bool in_nccl = nccl_->inside(&nccl_where, &nccl_entered);
  if (nccl_entered != wd_last_nccl_) {
    wd_last_nccl_ = nccl_entered;
    last_progress = now;
  }
  // Every wait on a peer is behind the stream (descriptor checks included: they are waits too)
  // and it is not inside NCCL: it runs this rank's own operations, which no peer holds up.
  if (!front && !in_nccl) last_progress = now;

  const std::string me = std::to_string(rank_);
  for (int p = 0; p < size_; ++p) {
    CallDesc pc;
    if (p == rank_ || !control_->peer_call(p, &pc)) continue;
    for (const CallDesc& d : calls)
      if (pc.seq == d.seq && pc != d)
        return fail(ErrorKind::Mismatch, mismatch_message(rank_, d, p, pc));
  }
  auto waiting_on = [&](int p) {
    if (in_nccl) return "; rank " + me + " was waiting inside NCCL (" + nccl_where + ")";
    if (waited_peer < 0) return "; rank " + me + " was waiting for its peers to join the call";
    if (desc_wait) return "; rank " + me + " was waiting for rank " + std::to_string(waited_peer) + " to join the call";
    return "; rank " + me + (p == waited_peer ? std::string(" was waiting to ") + doing + " it"
                                              : " was waiting on rank " + std::to_string(waited_peer));
  };
  if (slow) {
    check_host_messages();  // a device receive whose message the peer sent from a host buffer
    if (failed()) return;
  }
  for (int p = 0; p < size_ && slow; ++p) {
    if (p == rank_) continue;
    const PeerStatus st = control_->peer_status(p, true);
    if (st.state == PeerState::Failed)
      return fail(st.kind == ErrorKind::None ? ErrorKind::Comm : st.kind,
                  "rank " + me + " in " + what + ": rank " + std::to_string(p) + " failed: " + st.message);
    // A peer closes only once its calls drained: one whose last call is this one or later did
    // its part of it (this rank's stream is only slower, e.g. a communicator dropped without
    // close(), whose transport closes without the route's barrier), so that is no failure.
    CallDesc last;
    if (st.state == PeerState::Closed && stuck_call && control_->peer_call(p, &last) && last.seq >= stuck_call)
      continue;
    if (st.state == PeerState::Dead || st.state == PeerState::Closed)
      return fail(ErrorKind::Peer, gone_peer(p, st.state, what) + waiting_on(p));
  }
  if (std::chrono::duration<double>(now - last_progress).count() > opts_.timeout_s) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", opts_.timeout_s);
    fail(ErrorKind::Peer, (waited_peer >= 0 && !in_nccl ? "rank " + std::to_string(waited_peer) : std::string("a peer")) +
                              " did not answer for " + secs + " s (COMMLIB_TIMEOUT) during " + what +
                              waiting_on(waited_peer));
  }
}

}  // namespace commlib
