// The stream engine's calls (see stream_engine.h): the plan (plan/plan_cache.h, shared with the
// host), numbering a call with the
// host calls, ordering it after the previous one, the first call's check during set-up, and the
// enqueueing of a collective (its input copies, its steps on one or two streams, avg's divide).
#include <algorithm>

#include "plan/lowering.h"
#include "policy/device_auto.h"
#include "stream/stream_engine.h"
#include "schedule/registry.h"

namespace commlib {

CallDesc StreamEngine::describe(const CollectiveCall& call, uint8_t algo, uint64_t seq) const {
  return call_desc(call, static_cast<uint8_t>(algo | kDeviceCallAlgoBit), seq);
}

DeviceRoute StreamEngine::staged_route() const {
  return kernel_ && kernel_->pool_staging() ? DeviceRoute::Arena : DeviceRoute::Slots;
}

KernelAutoInputs StreamEngine::kernel_auto_inputs(DeviceRoute route) const {
  KernelAutoInputs in{device_->plan_blocks(1) > 0, opts_.path, opts_.link == DeviceLinkSetting::Nccl,
                      kernel_ ? kernel_->kernel_max_bytes() : kKernelPathMaxBytes, route,
                      kernel_ ? static_cast<uint64_t>(kernel_->staging_capacity()) : 0};
  if (kernel_) {  // the model costs the grids this path launches (before connect: the settings' defaults)
    in.cost.one_block_bytes = kernel_->ll_bytes();
    in.cost.block_bytes = static_cast<double>(kernel_->block_bytes());  // (the setting is at least 1)
  }
  return in;
}

const ResolvedPlan& StreamEngine::plan_of(const CollectiveCall& call, uint8_t* kernel_auto) {
  return plan_of(call, kernel_auto, staged_route());
}

const ResolvedPlan& StreamEngine::plan_of(const CollectiveCall& call, uint8_t* kernel_auto, DeviceRoute route) {
  const ResolvedPlan& policy = plans_.get(call);
  if (call.algo != 0) return policy;  // an algorithm named (or prepare()'s): kernel_auto_algorithm leaves it
  const KernelAutoCall shape{call.coll, call.algo, call.count, static_cast<int>(dtype_size(call.dtype)), policy.name,
                             policy.choice.source};
  uint8_t algo = kernel_auto_algorithm(size_, plans_.context().topology, kernel_auto_inputs(route), shape);
  // The host tuning table may name an algorithm only the host engine runs (kHostOnly): the device's own choice.
  if (!algo) {
    const std::string own = device_fallback_algorithm(shape, size_);
    if (!own.empty()) algo = static_cast<uint8_t>(algorithm_index(call.coll, own));
  }
  if (kernel_auto) *kernel_auto = algo;
  if (!algo) return policy;
  CollectiveCall c = call;
  c.algo = algo;
  return plans_.get(c);
}

PreparedCall StreamEngine::prepare(const CollectiveCall& call) {
  std::lock_guard<std::mutex> guard(enqueue_mu_);
  PreparedCall p{call, nullptr, path_of(call)};
  // A call whose route the ranks agree on per call (auto where the mapped route's choice is
  // one-sided) still agrees per call (a rank whose call is prepared and one whose is not must
  // agree alike), but the plans of every route are resolved here, once: no lookup per call (issue #37).
  if (call.algo == 0 && one_sided_candidate(call, nullptr)) {
    p.agrees_route = true;
    for (const DeviceRoute route : {DeviceRoute::Arena, DeviceRoute::Mapped, DeviceRoute::Slots}) {
      uint8_t algo = 0;
      plan_of(call, &algo, route);
      CollectiveCall c = call;
      if (algo) c.algo = algo;
      (route == DeviceRoute::Mapped ? p.mapped_plan : route == DeviceRoute::Slots ? p.slots_plan : p.plan) =
          plans_.get_shared(c);  // (plan_of's, held)
    }
    return p;
  }
  uint8_t algo = 0;
  plan_of(call, &algo);
  if (algo) p.call.algo = algo;
  if (p.call.algo != kNcclAlgorithmCode) p.plan = plans_.get_shared(p.call);  // (plan_of's, held)
  // An auto call that stages without agreeing (premul_sum's scaled input) resolved for the arena:
  // the slots' choice too, taken once the arena is lost, as an unprepared rank's call takes it.
  if (call.algo == 0 && staged_route() == DeviceRoute::Arena) {
    uint8_t slots_algo = 0;
    plan_of(call, &slots_algo, DeviceRoute::Slots);
    CollectiveCall c = call;
    if (slots_algo) c.algo = slots_algo;
    p.slots_plan = plans_.get_shared(c);
  }
  return p;
}

std::string StreamEngine::resolved_algorithm(const CollectiveCall& call) {
  std::lock_guard<std::mutex> guard(enqueue_mu_);
  return plan_of(call).name;
}

void StreamEngine::throw_if_failed_locked() {
  if (closed_) throw CommError("communicator is closed");
  if (!connected_) throw CommError("stream engine: not connected");
  if (failed()) {
    std::lock_guard<std::mutex> lk(mu_);
    raise_to_caller(fail_kind_, "communicator aborted: " + fail_message_);
  }
}

namespace {

// Two device calls alike but for the algorithm auto resolved them to. Before connect that is what
// ranks with different COMMLIB_DEVICE_PATH or COMMLIB_DEVICE_LINK see (the kernel path's auto reads
// them: policy/device_auto.h); connect's checks name the setting, so the first call's check leaves
// it to them. Where the settings agree, the call itself finds the mismatch (its descriptor check).
bool auto_apart(const CallDesc& mine, const CallDesc& theirs) {
  CallDesc same = theirs;
  same.algo = mine.algo;
  return (theirs.algo & kDeviceCallAlgoBit) && same == mine;
}

}  // namespace

void StreamEngine::check_first_call(const CollectiveCall& call) {
  std::lock_guard<std::mutex> guard(enqueue_mu_);
  if (failed()) {
    std::lock_guard<std::mutex> lk(mu_);
    raise_to_caller(fail_kind_, "communicator aborted: " + fail_message_);
  }
  const CallDesc desc = describe(call, plan_of(call).algo, control_->peek_call_seq());
  control_->publish_call(desc);
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const PeerStatus st = control_->peer_status(p, false);
    CallDesc pc;
    std::string msg;
    ErrorKind kind = ErrorKind::Mismatch;
    if (st.state == PeerState::Failed) {
      kind = st.kind == ErrorKind::None ? ErrorKind::Comm : st.kind;
      msg = "rank " + std::to_string(rank_) + " cannot start " + describe_call(desc) + ": rank " + std::to_string(p) +
            " failed: " + st.message;
    } else if (control_->peer_call(p, &pc) && pc.seq == desc.seq && pc != desc &&
               !(call.algo == 0 && auto_apart(desc, pc))) {
      msg = mismatch_message(rank_, desc, p, pc);
    }
    if (!msg.empty()) {
      fail(kind, msg);
      raise_to_caller(kind, msg);
    }
  }
}

void StreamEngine::begin(const CallDesc& desc, DeviceStream& s) {
  bool wake_watchdog;
  {
    // Calls that completed since the watchdog's last tick leave now (their done words read, their
    // events back to the pool), so a tight loop of calls keeps the in-flight queue short.
    retire_completed(true);
  }
  {
    // The number and the entry together: a failure (fail_as, on the watchdog) between the two saw
    // the new number with no call of it in flight, failed only the calls after it, and this call,
    // released and run through, completed without error.
    std::lock_guard<std::mutex> lk(mu_);
    ++seq_;
    in_flight_.push_back(InFlight{seq_, desc, Completion{}, false});
    wake_watchdog = watchdog_parked_;  // else it ticks anyway and finds the call on its next tick
  }
  if (wake_watchdog) cv_.notify_all();
  // Calls execute in call order: one on another stream than the last waits for it (its done word
  // or its event; the same stream orders them itself).
  if (s.native_handle() != last_done_stream_ && !last_done_.captured()) order_after(last_done_, s);
}

uint64_t StreamEngine::finish(const Launched& launched, const std::string& enqueue_error, DeviceStream& s,
                              CallWork* work) {
  Completion done;
  if (launched.done_dev && enqueue_error.empty()) {
    // The launch is the call's last operation: its done word is the call's completion (no event).
    done.word = launched.done;
    done.word_dev = launched.done_dev;
    done.target = launched.target;
  } else {
    done.event = events_->take();
    device_->record(*done.event, s);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = in_flight_.size(); i-- > 0;)  // the newest entry (retire stops at an unrecorded one)
      if (in_flight_[i].seq == seq_) {
        in_flight_[i].done = done;
        in_flight_[i].recorded = true;
        break;
      }
  }
  last_done_ = done;
  last_done_stream_ = s.native_handle();
  if (!enqueue_error.empty()) {
    // The engine's first error: ours, or the one that made the enqueue fail (the watchdog may
    // have failed the engine meanwhile, e.g. a mismatch aborting the NCCL communicator).
    std::lock_guard<std::mutex> lk(mu_);
    raise_to_caller(fail_kind_, fail_message_);
  }
  if (work) *work = CallWork{std::move(done), seq_};
  return seq_;
}

std::shared_ptr<DeviceWork> StreamEngine::collective(const CollectiveCall& call, DeviceStream& s) {
  CallWork work;
  run_collective(call, nullptr, s, &work);
  return std::make_shared<DeviceWork>(shared_from_this(), std::move(work.done), work.seq);
}

uint64_t StreamEngine::collective_unhandled(const CollectiveCall& call, DeviceStream& s) {
  return run_collective(call, nullptr, s, nullptr);
}

std::shared_ptr<DeviceWork> StreamEngine::collective(const PreparedCall& call, DeviceStream& s,
                                                     const CaptureStatus* known_capture) {
  CallWork work;
  run_collective(call.call, call.plan ? &call : nullptr, s, &work, known_capture);
  return std::make_shared<DeviceWork>(shared_from_this(), std::move(work.done), work.seq);
}

uint64_t StreamEngine::collective_unhandled(const PreparedCall& call, DeviceStream& s,
                                            const CaptureStatus* known_capture) {
  return run_collective(call.call, call.plan ? &call : nullptr, s, nullptr, known_capture);
}

uint64_t StreamEngine::collective_into(const PreparedCall& call, DeviceStream& s, DeviceWork& reused,
                                       const CaptureStatus* known_capture) {
  CallWork work;
  const uint64_t ordinal = run_collective(call.call, call.plan ? &call : nullptr, s, &work, known_capture);
  // Re-armed only once the call was enqueued: a refused call leaves the handle as it was.
  reused.rearm(shared_from_this(), std::move(work.done), work.seq);
  return ordinal;
}

uint64_t StreamEngine::run_collective(const CollectiveCall& call, const PreparedCall* prepared, DeviceStream& s,
                                      CallWork* work, const CaptureStatus* known_capture) {
  std::lock_guard<std::mutex> guard(enqueue_mu_);
  throw_if_failed_locked();
  try {
    DeviceGuard current(*device_);  // kernels and records on the engine's device, restored after
    // cudaStreamGetCaptureInfo: a capturing stream records the call into its graph (stream_capture.cc);
    // asked once per call, here or by the caller just before (known_capture).
    const CaptureStatus capture = known_capture ? *known_capture : device_->capture_status(s);
    if (capture != CaptureStatus::None) return capture_collective(call, s, capture, work);
    return enqueue_collective(call, prepared, s, work);
  } catch (const CommError&) {
    throw;
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& e) {  // a device error (sticky CUDA error): CommError
    device_error("enqueueing a collective", e);
  }
}

uint64_t StreamEngine::enqueue_collective(const CollectiveCall& call, const PreparedCall* prepared, DeviceStream& s,
                                          CallWork* work) {
  const size_t esize = dtype_size(call.dtype);
  if (call.algo == kNcclAlgorithmCode) {  // algorithm="nccl": NCCL's own collective, no schedule
    NcclLink::check_supported(call.dtype, call.op, call.coll);
    if (!nccl_->ready()) throw CommError("algorithm='nccl': the NCCL communicator was not created");
  }
  // A one-sided route (every rank's buffers mapped, or staged) is agreed with every rank first:
  // auto's choice reads it (policy/device_auto.h), the launch takes it (stream_one_sided.cc).
  // Retired staging arenas every rank is done with are freed at every eager call, and again after
  // an agreement, where every peer has published what it was done with (kernel_path_arena.cc).
  if (kernel_) kernel_->collect_arenas(s);
  const MappedPeers* agreed = &one_sided_.staged;  // (the engine's: no allocation per call)
  if (one_sided_candidate(call, prepared)) {
    agreed = &agree_route(call);
    if (kernel_) kernel_->collect_arenas(s);
  }
  const MappedPeers& route = *agreed;
  // The plan of the route taken (a prepared auto call holds one per route), and its device plan's slot.
  const DeviceRoute taken = route.mapped ? DeviceRoute::Mapped : staged_route();
  auto prepared_plan = [&](DeviceRoute r, KernelPlanSlot** slot) -> const ResolvedPlan& {
    const bool routed = prepared->agrees_route && prepared->mapped_plan;
    if (routed && r == DeviceRoute::Mapped) return *slot = prepared->mapped_kernel_plan.get(), *prepared->mapped_plan;
    if (r == DeviceRoute::Slots && prepared->slots_plan)  // (an agreeing call's, or an auto call's that stages)
      return *slot = prepared->slots_kernel_plan.get(), *prepared->slots_plan;
    return *slot = prepared->kernel_plan.get(), *prepared->plan;
  };
  KernelPlanSlot* plan_slot = nullptr;
  const ResolvedPlan* planned = !prepared ? &plan_of(call, nullptr, taken) : &prepared_plan(taken, &plan_slot);
  // Peers' memory, read in place: the kernel path or nothing (alike on every rank); staged, its
  // buffers go into the staging arena (grown alike on every rank) or must fit the slots (prepared
  // calls too: their route is agreed per call).
  const auto key_of = [&](const ResolvedPlan& p) {
    return ScheduleKey{static_cast<uint8_t>(call.coll), p.algo, call.root, call.count, static_cast<uint8_t>(esize)};
  };
  if (planned->one_sided && !route.mapped) {
    if (!kernel_ || !kernel_->usable() || nccl_->carries_any())
      throw std::invalid_argument("algorithm: " + planned->name + " is one-sided (it reads and writes peers' mapped "
                                  "buffers): it runs on the device kernel path only, which this communicator lacks "
                                  "(COMMLIB_DEVICE_PATH=copy, a peer on another host or over the nccl link)");
    if (!staged_in_arena(call, key_of(*planned), s)) {
      // Auto's choice was the arena's, and no rank could grow one (pool staging now off on every
      // rank): the slots' choice instead, which fits them or is a message plan.
      const bool auto_call = call.algo == 0 || (prepared && prepared->slots_plan);
      if (auto_call && taken == DeviceRoute::Arena && staged_route() == DeviceRoute::Slots)
        planned = !prepared ? &plan_of(call, nullptr, DeviceRoute::Slots) : &prepared_plan(DeviceRoute::Slots, &plan_slot);
      if (planned->one_sided) kernel_->check_one_sided(key_of(*planned));  // through the slots: they must fit
    }
  }
  // A one-sided plan runs on the kernel path whatever the size (checked above that it can).
  DeviceCallPath path = planned->one_sided ? DeviceCallPath::Kernel : prepared ? prepared->path : path_of(call);
  if (call.codec.active()) path = compressed_path(call, *planned, path);

  // Nothing above enqueued anything or took a number: a refused argument leaves the numbering
  // and the stream as they were. From here on the call is numbered (with the host calls).
  const CallDesc desc = describe(call, planned->algo, control_->next_call_seq());

  // A peer that failed earlier (its failure is on the control plane) fails this call at once.
  ErrorKind kind;
  std::string msg;
  if (failed_peer_error(desc, rank_, size_, [this](int p) { return control_->peer_status(p, false); }, &kind, &msg)) {
    fail(kind, msg);
    raise_to_caller(kind, msg);
  }

  begin(desc, s);
  std::string enqueue_error;
  Launched launched;
  try {
    if (path == DeviceCallPath::Kernel) {
      // Where host calls (and peers whose calls do not join this rank) look; the kernel checks its
      // peers' descriptors itself, without a host function (kernels/plan_call_check.cuh).
      if (publish_kernel_calls_) control_->publish_call(desc);
    } else if (size_ > 1) {
      copy_->enqueue_call_check(desc, seq_, s);  // against every rank (copy_path.h)
    }
    std::vector<std::pair<int, CallDesc>> remote_peers;  // on other hosts: descriptors in-band
    for (int p : planned->peers)
      if (remote(p)) remote_peers.emplace_back(p, desc);
    remote_descs_->exchange(remote_peers, remote_peers, seq_, s);
    launched = enqueue_call(call, *planned, path, desc, esize, s, false, route.mapped ? &route : nullptr, plan_slot);
  } catch (const std::exception& e) {
    // Partly enqueued: the ranks' counters no longer agree, so the engine cannot go on. This
    // rank's failure (often its device's sticky error, first seen here): CommError here, and the
    // peers hear of a failed peer (PeerError), as from fail_device; publishing Comm made a healthy
    // peer's next call raise CommError ("cannot start ...: rank r failed earlier").
    enqueue_error = "rank " + std::to_string(rank_) + " could not enqueue " + describe_call(desc) + ": " + e.what();
    fail_as(ErrorKind::Comm, ErrorKind::Peer, enqueue_error, true);
  }
  return finish(launched, enqueue_error, s, work);
}

// compress= runs the schedule's messages encoded on the copy path (copy_path_codec.cc), whatever
// path the size would take (compress_inter_only across hosts too: raw within a host, encoded
// between hosts); what it cannot run is refused before the call is numbered.
DeviceCallPath StreamEngine::compressed_path(const CollectiveCall& /*call*/, const ResolvedPlan& planned,
                                             DeviceCallPath path) const {
  if (planned.one_sided || path == DeviceCallPath::Nccl)
    throw std::invalid_argument("algorithm: " + planned.name + " does not run with compress= (it encodes the messages "
                                "of a schedule; this one " + (planned.one_sided ? "reads peers' buffers" : "is NCCL's own") + ")");
  return DeviceCallPath::Copy;
}

DeviceCallPath StreamEngine::path_of(const CollectiveCall& call) const {
  const uint64_t bytes = static_cast<uint64_t>(call.count) * dtype_size(call.dtype);
  return device_path_of(call.algo == kNcclAlgorithmCode, bytes, opts_.path,
                        kernel_ ? kernel_->kernel_max_bytes() : kKernelPathMaxBytes, kernel_ && kernel_->usable(),
                        nccl_->carries_any());
}

Launched StreamEngine::enqueue_call(const CollectiveCall& call, const ResolvedPlan& plan, DeviceCallPath path,
                                    const CallDesc& desc, size_t esize, DeviceStream& s, bool captured,
                                    const MappedPeers* mapped, KernelPlanSlot* plan_slot) {
  char* in = reinterpret_cast<char*>(call.input);
  char* out = reinterpret_cast<char*>(call.output);
  const InputStaging staging = input_staging(call, rank_, size_);
  if (staging.kind != InputStaging::None) {
    char* buf = grow(input_copy_, input_copy_bytes_, staging.elements * esize, s);
    if (staging.kind == InputStaging::Scale && staging.elements)
      device_->scale_copy(buf, in, staging.elements, call.dtype, call.scale, s);
    else if (staging.kind == InputStaging::Copy)
      device_->copy(buf, in, staging.elements * esize, s);
    in = buf;
  }
  const Schedule& sched = plan.sched;
  char* scr = sched.scratch_count ? grow(scratch_, scratch_bytes_, static_cast<size_t>(sched.scratch_count) * esize, s)
                                  : nullptr;
  char* const bases[3] = {in, out, scr};
  // The path device auto chose (policy/device_auto.h), all three behind one interface.
  DevicePathRunner& runner = path == DeviceCallPath::Kernel ? static_cast<DevicePathRunner&>(*kernel_)
                             : path == DeviceCallPath::Nccl ? static_cast<DevicePathRunner&>(*nccl_)
                                                            : static_cast<DevicePathRunner&>(*copy_);
  last_path_ = path == DeviceCallPath::Kernel ? "kernel" : "copy";  // NCCL's own collective shows as copy
  last_algorithm_ = plan.name;
  Launched l = runner.enqueue(PathCall{plan, call, desc, bases, seq_, captured, mapped, plan_slot}, s);
  if (l.done) note_wait(StreamWait{l.done, l.target, l.peer, l.send, seq_});  // the launch's first peer until it completes
  if (avg_divides(call, rank_) && call.count) {
    device_->divide_unless(copy_->gate_after_call(s), out, static_cast<size_t>(call.count), call.dtype, size_, s);
    l.done_dev = nullptr;  // the divide ends the call, after the launch: its completion is an event
  }
  return l;
}

}  // namespace commlib
