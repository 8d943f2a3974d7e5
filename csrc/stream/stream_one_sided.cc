// The stream engine's one-sided calls: the route every rank takes for a call whose plan reads and
// writes peers' buffers in place (docs/gpu.md "One-sided plans on the kernel path").
//
// Every rank must take the same route: a rank reading a peer's input in place while that peer
// staged it (or the other way round) reads the wrong bytes. So the route is not one rank's view of
// the registry (device/peer_buffers.h, lookup: a prediction) but PeerBuffers::agree: each rank
// writes its registration of the call's input and output into its ring and reads every peer's,
// and every rank answers from the same entries. That is a host wait for every peer to reach the
// call (one per call, both buffers' entries written first: peer_buffers_agree.cc), taken only by the calls that may use the answer, chosen from what every rank knows alike
// (one_sided_candidate): a one-sided algorithm named, or auto where the cost model's choice on the
// mapped route is one-sided (policy/device_auto.h, kernel_auto_may_map). A prepared call of such
// a shape agrees per call as well (so ranks that prepare and ranks that do not agree alike), with
// the plans of both routes resolved once (StreamEngine::prepare, PreparedCall::mapped_plan). Calls on a capturing stream (stream_capture.cc) never agree: a graph's replays
// stage, in the staging arena or the slots (every rank captures the same calls, as any captured
// collective needs).
#include <algorithm>
#include <chrono>
#include <functional>
#include <stdexcept>

#include "common/shapes.h"
#include "plan/lowering.h"
#include "policy/device_auto.h"
#include "stream/stream_engine.h"

namespace commlib {

bool StreamEngine::one_sided_candidate(const CollectiveCall& call, const PreparedCall* prepared) {
  if (size_ < 2 || !kernel_ || !kernel_->usable() || nccl_->carries_any() || call.algo == kNcclAlgorithmCode)
    return false;
  // A private copy of the input (premul_sum's scaled input) is the engine's own memory, never
  // registered: such calls stage, with no agreement needed (every rank's op is the same). An
  // in-place all_to_all's copy is a per-rank choice, though (some ranks may call it out of place,
  // who do agree): it agrees too, registering no input, so every rank stages (agree_route).
  if (input_staging(call, rank_, size_).kind == InputStaging::Scale) return false;
  if (prepared) return prepared->agrees_route || prepared->plan->one_sided;
  const ResolvedPlan& policy = plans_.get(call);
  if (call.algo != 0) return policy.one_sided;
  const KernelAutoCall shape{call.coll, 0, call.count, static_cast<int>(dtype_size(call.dtype)), policy.name,
                             policy.choice.source};
  return kernel_auto_may_map(size_, plans_.context().topology, kernel_auto_inputs(DeviceRoute::Mapped), shape);
}

template <class Wait>
bool StreamEngine::wait_for_peers(const CollectiveCall& call, const char* what, Wait&& wait) {
  // A peer that failed (its failure on the control plane) never reaches the call: stop waiting,
  // and fail the call as any call after a peer's failure (PeerError naming it), not by the timeout.
  // A peer that died (SIGKILL) never reaches it either, and publishes nothing: its process is asked
  // every kLivenessEvery, as the watchdog does (a system call, not one per spin). A peer that is
  // closing marks its table first (StreamEngine::close), which the wait reads while that peer's
  // entry is missing (PeerBuffers::wait_entries: PeerClosing), so its close's barrier and this
  // wait no longer wait each other out (session 35). One that made this call before it closed
  // wrote its entry: its close stops nothing. (`stop` captures `this` alone: a std::function
  // holds it in place, no allocation.)
  one_sided_.liveness_at = std::chrono::steady_clock::now();
  const auto stop = [this] {
    if (failed()) return true;
    const auto now = std::chrono::steady_clock::now();
    const bool process = now - one_sided_.liveness_at >= OneSidedScratch::kLivenessEvery;
    if (process) one_sided_.liveness_at = now;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const PeerState st = control_->peer_status(p, process).state;
      if (st == PeerState::Failed || st == PeerState::Dead) return true;
    }
    return false;
  };
  try {
    return wait(stop);
  } catch (const PeerClosing& e) {
    const CallDesc desc = describe(call, call.algo, control_->peek_call_seq());
    const std::string msg = gone_peer(e.peer, PeerState::Closed, describe_call(desc)) + "; rank " +
                            std::to_string(rank_) + " was " + what;
    fail(ErrorKind::Peer, msg);
    raise_to_caller(ErrorKind::Peer, msg);
  } catch (const std::runtime_error& e) {
    const auto status = [this](int p) { return control_->peer_status(p, false); };
    ErrorKind kind;
    std::string msg;
    const CallDesc desc = describe(call, call.algo, control_->peek_call_seq());
    if (failed_peer_error(desc, rank_, size_, status, &kind, &msg)) {
      fail(kind, msg);
      raise_to_caller(kind, msg);
    }
    for (int p = 0; p < size_; ++p) {  // (session 32: a dead peer was waited for the whole timeout, a CommError)
      if (p == rank_) continue;
      const PeerStatus st = control_->peer_status(p, true);
      if (st.state != PeerState::Dead && st.state != PeerState::Closed) continue;
      msg = gone_peer(p, st.state, describe_call(desc)) + "; rank " + std::to_string(rank_) + " was " + what;
      fail(ErrorKind::Peer, msg);
      raise_to_caller(ErrorKind::Peer, msg);
    }
    throw std::runtime_error(std::string(collective_name(call.coll)) + " on rank " + std::to_string(rank_) + ", " +
                             what + ": " + e.what());
  }
}

const MappedPeers& StreamEngine::agree_route(const CollectiveCall& call) {
  const size_t esize = dtype_size(call.dtype);
  const BufferShapes shapes = buffer_shapes(call.coll, call.count, size_, rank_, call.root);
  const size_t in_bytes = static_cast<size_t>(std::max<int64_t>(shapes.input, 0)) * esize,
               out_bytes = static_cast<size_t>(std::max<int64_t>(shapes.output, 0)) * esize;
  const uint64_t number = ++one_sided_calls_;
  PeerBuffers& registry = kernel_->peer_buffers();
  // The views and the route are the engine's, refilled in place (one_sided_scratch.h): after the
  // first call their vectors hold every rank's entry already, so a steady call allocates nothing.
  OneSidedScratch& o = one_sided_;
  MappedPeers& route = o.route;
  // In place (an all_to_all whose input is its output: input_staging copies it into the engine's
  // memory, which the kernel reads): no input is registered, so every rank stages the call, the
  // ranks that call it out of place too (a per-rank choice, as for every other algorithm).
  const bool in_place = input_staging(call, rank_, size_).kind == InputStaging::Copy;
  route.mapped = wait_for_peers(call, "agreeing on the peers' buffers", [&](const std::function<bool()>& stop) {
    return registry.agree(number, in_place ? nullptr : reinterpret_cast<const void*>(call.input), in_bytes,
                          reinterpret_cast<const void*>(call.output), out_bytes, stop, &o.in, &o.out);
  });
  if (!route.mapped) return route;
  route.in.assign(o.in.peer.begin(), o.in.peer.end());
  route.out.assign(o.out.peer.begin(), o.out.peer.end());
  route.in[rank_] = reinterpret_cast<char*>(call.input);
  route.out[rank_] = reinterpret_cast<char*>(call.output);
  return route;
}

bool StreamEngine::staged_in_arena(const CollectiveCall& call, const ScheduleKey& key, DeviceStream& s) {
  if (!kernel_->pool_staging()) return false;
  const uint64_t need = kernel_->staging_need(key);
  if (need == 0) return false;  // nothing staged (no peer, or no bytes): the slots' path has nothing to copy either
  if (kernel_->pool_holds(need)) return true;
  // Every rank grows at this call (kernel_path_arena.cc): a one-sided number of its own for the exchange.
  const uint64_t number = ++one_sided_calls_;
  return wait_for_peers(call, "growing its staging arena", [&](const std::function<bool()>& stop) {
    return kernel_->grow_arena(need, number, stop);
  });
}

}  // namespace commlib
