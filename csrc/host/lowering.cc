// Step lowering: a planned schedule's regions become buffer addresses (input, output, scratch) and
// each step runs on the executor; also the point-to-point batch and the buffers the communicator
// owns (scratch, the private input copy).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/shapes.h"
#include "host/communicator.h"
#include "plan/describe.h"
#include "plan/lowering.h"
#include "kernels/cpu_reduce.h"
#include "policy/auto_policy.h"
#include "schedule/lanes.h"
#include "schedule/registry.h"

namespace commlib {

namespace {

using Clock = std::chrono::steady_clock;

// The communicator's own buffers (scratch, the private input copy) are what peers read with
// single-copy reads when a schedule sends from them (an in-place all_to_all of several steps sends
// every block from the input copy). From 2 MiB on they are whole 2 MiB pages, aligned and marked for
// transparent huge pages (the machines run THP in "madvise" mode): process_vm_readv of a block on
// 4 KiB pages walks and pins every page and copies slower (an in-place 16 MiB direct all_to_all on
// 4 ranks, every block read from this copy as it then was: 20.9 -> 13.5 ms of CPU a call for the
// four ranks with huge pages, bench/RESULTS_collectives.md, session 21). Where THP is off the hint
// does nothing.
constexpr size_t kHugePage = size_t{2} << 20;

char* aligned_alloc_bytes(size_t bytes) {
  void* p = nullptr;
  if (bytes < kHugePage) {
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) throw std::bad_alloc();
    return static_cast<char*>(p);
  }
  const size_t whole = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  if (posix_memalign(&p, kHugePage, whole)) throw std::bad_alloc();
  madvise(p, whole, MADV_HUGEPAGE);  // a hint: failure (no THP) leaves ordinary pages
  return static_cast<char*>(p);
}

}  // namespace

char* Communicator::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    scratch_.reset(aligned_alloc_bytes(bytes));
    scratch_bytes_ = bytes;
  }
  return scratch_.get();
}

// auto's small broadcasts, barriers, all_gathers, all_to_alls, all_reduces and reduce_scatters, when
// every rank is on this host: through the shared-memory flags (host/flag_calls.cc), one write read
// by every rank, instead of the schedule; up to the tuning's cutoff for the collective and world
// size (policy/flag_cutoff.h), else while the input fits a slot. Only when auto itself chose (an
// algorithm the caller or COMMLIB_ALGO_<COLLECTIVE> named runs as named), so every rank decides
// alike from the call. The
// "shared" broadcast, however chosen, runs through the root's stream the same way (its schedule,
// direct's messages, only off one host).
Communicator::FlagRoute Communicator::flag_route(const CollectiveCall& call, const ResolvedPlan& planned) const {
  const bool auto_chose = call.algo == 0 && !call.codec.active() && !planned.overridden;
  return flag_route(call.coll, call.count, dtype_size(call.dtype), auto_chose,
                    planned.name == "shared" && !call.codec.active(), planned.flags_max);
}

Communicator::FlagRoute Communicator::flag_route(Collective coll, int64_t count, size_t esize, bool auto_chose,
                                                  bool shared_unencoded, int64_t flags_max) const {
  if (coll == Collective::Barrier) return auto_chose && exec_.flags_fit(0) ? FlagRoute::Barrier : FlagRoute::None;
  // (the tuning's cutoff is in auto's bytes, as its rows are: the per-rank count x element size)
  const bool under_cutoff = count * static_cast<int64_t>(esize) <= flags_max;
  const int64_t in_bytes = Executor::flag_exchange_input_bytes(coll, count, esize, size_);
  if (in_bytes >= 0)
    return auto_chose && under_cutoff && exec_.flags_fit(static_cast<size_t>(in_bytes)) ? FlagRoute::Exchange
                                                                                         : FlagRoute::None;
  if (coll != Collective::Broadcast) return FlagRoute::None;
  if (shared_unencoded && exec_.stream_fits()) return FlagRoute::Stream;
  return auto_chose && under_cutoff && exec_.flags_fit(static_cast<size_t>(count) * esize) ? FlagRoute::Broadcast
                                                                                           : FlagRoute::None;
}

void Communicator::run_flag_call(const CollectiveCall& call, FlagRoute route, const CallDesc& desc, size_t bytes,
                                 bool stream) {
  const char* in = reinterpret_cast<const char*>(call.input);
  char* out = reinterpret_cast<char*>(call.output);
  switch (route) {
    case FlagRoute::Barrier:
      exec_.flag_barrier(desc);
      return;
    case FlagRoute::Exchange: {
      const size_t esize = dtype_size(call.dtype);
      const auto in_bytes =
          static_cast<size_t>(Executor::flag_exchange_input_bytes(call.coll, call.count, esize, size_));
      if (call.op == RedOp::PremulSum && collective_reduces(call.coll)) {  // (reduced as a sum of the scaled inputs)
        char* scaled = input_copy(in_bytes);
        scale_copy(scaled, in, in_bytes / esize, call.dtype, call.scale);
        in = scaled;
      }
      exec_.flag_exchange(call.coll, in, in_bytes, out, static_cast<size_t>(call.count) * esize,
                          static_cast<size_t>(call.count), call.dtype, call.op, desc);
      if (avg_divides(call, rank_)) divide_inplace(out, static_cast<size_t>(call.count), call.dtype, size_);
      return;
    }
    case FlagRoute::Stream:
      exec_.stream_broadcast(in ? in : out, out ? out : const_cast<char*>(in), bytes, call.root, desc, stream);
      return;
    case FlagRoute::Broadcast:
      exec_.flag_broadcast(in ? in : out, out ? out : const_cast<char*>(in), bytes, call.root, desc);
      return;
    case FlagRoute::None:
      break;
  }
  throw std::logic_error("run_flag_call: no flag route");
}

char* Communicator::input_copy(size_t bytes) {
  if (bytes > input_copy_bytes_) {
    input_copy_.reset(aligned_alloc_bytes(bytes));
    input_copy_bytes_ = bytes;
  }
  return input_copy_.get();
}

void Communicator::run_collective(const CollectiveCall& call, uint64_t seq) {
  throw_if_aborted();
  const size_t esize = dtype_size(call.dtype);
  const int64_t bytes = call.count * static_cast<int64_t>(esize);
  // The number was taken when the call was submitted (communicator.h: next_call_seq); a refused
  // argument here uses it up, alike on every rank that refuses it.
  const ResolvedPlan& planned = plan(call, bytes);
  const Schedule& sched = planned.sched;
  const std::string& algo = planned.name;
  // Python refuses it first (call_checks.py); the C++ fast path does not: refused alike on every
  // rank, whatever the world size (one rank's schedule has no one-sided op to notice).
  if (planned.algorithm_one_sided)
    throw std::invalid_argument("algorithm: " + algo + " is one-sided (it reads peers' mapped buffers), which the "
                                "host executor does not run");

  // A flag exchange or broadcast is described as one ("flags" in its errors, not the schedule it
  // skipped); every rank routes a call alike, so the descriptions still agree.
  const FlagRoute route = flag_route(call, planned);
  const bool flags = route == FlagRoute::Exchange || route == FlagRoute::Broadcast;
  const CallDesc desc = call_desc(call, flags ? kFlagCallAlgorithmCode : planned.algo, seq);
  publish_call(desc);

  const auto t0 = opts_.debug >= 2 ? Clock::now() : Clock::time_point{};
  try {
    exec_.check_peers_failed(desc);
    // The root's output (the largest) stands for every rank's: all ranks must decide alike.
    const bool stream =
        exec_.streams_call(planned.streaming_start, bytes, static_cast<size_t>(planned.root_output) * esize * size_);
    if (route != FlagRoute::None) {
      run_flag_call(call, route, desc, static_cast<size_t>(bytes), stream);
      return;
    }
    const size_t copy_chunk = (!collective_reduces(call.coll) && size_ >= 4) ? exec_.options().copy_chunk_bytes : 0;
    exec_.begin_call(stream, copy_chunk, single_copy_min_message(exec_.options().single_copy, planned.single_copy_auto));

    char* in = reinterpret_cast<char*>(call.input);
    char* out = reinterpret_cast<char*>(call.output);
    const InputStaging staging = input_staging(call, rank_, size_);
    // An in-place all_to_all of one step (direct) sends from the caller's buffer itself and lands
    // its receives in scratch, copied over the buffer once the step is done (by then every peer has
    // read this rank's blocks): per rank (P-1) blocks received and copied back instead of the whole
    // buffer copied, every block received and its own block copied (16 MiB on 4 ranks: 24 MiB moved
    // instead of 32). On a failure mid-step the caller's buffer is left as it was.
    const bool land_in_scratch = staging.kind == InputStaging::Copy && call.coll == Collective::AllToAll &&
                                 !call.codec.active() && sched.steps.size() == 1 && sched.scratch_count == 0;
    char* landing = land_in_scratch ? scratch(static_cast<size_t>(call.count) * esize * (size_ - 1)) : nullptr;
    landed_.clear();
    if (staging.kind != InputStaging::None && !land_in_scratch) {
      char* buf = input_copy(staging.elements * esize);
      if (staging.kind == InputStaging::Scale)
        scale_copy(buf, in, staging.elements, call.dtype, call.scale);
      else
        std::memcpy(buf, in, staging.elements * esize);
      in = buf;
    }
    char* scr = sched.scratch_count ? scratch(static_cast<size_t>(sched.scratch_count) * esize) : nullptr;
    char* bases[3] = {in, out, scr};

    auto lower = [&](const Op& op, uint32_t lane) {
      ExecOp e;
      e.kind = op.kind;
      e.peer = op.peer;
      e.desc = desc;
      e.lane = lane;
      const Region& r = (op.kind == OpKind::Send) ? op.src : op.dst;
      e.bytes = static_cast<size_t>(r.count) * esize;
      auto resolve = [&](const Region& reg) { return region_address(bases, reg, esize, desc, rank_, algo); };
      if (op.kind == OpKind::Send) {
        e.src = resolve(op.src);
      } else {
        e.dst = resolve(op.dst);
        if (op.kind == OpKind::Copy || op.kind == OpKind::Reduce || reduces_from_src(op)) e.src = resolve(op.src);
      }
      return e;
    };
    if (call.codec.active()) {
      run_compressed_steps(call, sched, desc, bases);  // (a laned schedule too: in list order)
    } else if (planned.lanes > 1) {  // the lanes in flight (executor_lanes.cc)
      ops_.clear();
      laned_.begin.clear();
      laned_.lane.clear();
      laned_.lanes = planned.lanes;
      laned_.window = sched.window;
      intra_window_gates(sched, rank_, topology_.host_of, laned_.gate);  // (empty: no intra window)
      for (const Step& step : sched.steps) {
        laned_.begin.push_back(ops_.size());
        laned_.lane.push_back(step.lane);
        for (const Op& op : step.ops) ops_.push_back(lower(op, static_cast<uint32_t>(step.lane)));
      }
      laned_.begin.push_back(ops_.size());
      exec_.run_lanes(ops_, laned_, call.dtype, call.op, desc);
    } else {
      for (const Step& step : sched.steps) {
        ops_.clear();
        for (const Op& op : step.ops) {
          ExecOp e = lower(op, 0);
          if (landing && op.kind == OpKind::Recv) {
            landed_.push_back({e.dst, landing, e.bytes});
            e.dst = landing;
            landing += e.bytes;
          }
          ops_.push_back(e);
        }
        exec_.run_step(ops_, call.dtype, call.op, desc);
        for (const Landed& l : landed_) std::memcpy(l.dst, l.from, l.bytes);
      }
    }

    if (avg_divides(call, rank_)) divide_inplace(out, static_cast<size_t>(call.count), call.dtype, size_);
  } catch (const CommError& e) {
    fail_communicator(e);
    throw;
  }
  if (opts_.debug >= 2) {
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    std::fprintf(stderr, "commlib TRACE %s rank %d: %s done in %.1f us\n", opts_.label.c_str(), rank_,
                 describe_call(desc).c_str(), us);
  }
}

// The sends' crossover (policy/single_copy.h), read again only when the tuning generation moved (a
// new table): no lock per batch. Batches run one at a time, so the copy is this thread's alone.
int64_t Communicator::p2p_single_copy_min(int64_t largest) {
  const SingleCopySetting& s = exec_.options().single_copy;
  if (s.mode != SingleCopySetting::Auto) return single_copy_min_message(s, kSingleCopyNever);
  const uint64_t gen = tuning_generation();
  if (gen != p2p_crossover_generation_) {
    p2p_crossover_ = single_copy_crossover(Collective::Send, size_);
    p2p_crossover_generation_ = gen;
  }
  return single_copy_auto_min(p2p_crossover_, largest);
}

void Communicator::run_p2p(const std::vector<P2PItem>& items, DType dtype, const std::vector<uint64_t>& seqs,
                           const CallDesc* as_call) {
  throw_if_aborted();
  const size_t esize = dtype_size(dtype);
  ops_.clear();
  CallDesc any;
  for (size_t i = 0; i < items.size(); ++i) {
    const P2PItem& it = items[i];
    ExecOp e;
    e.kind = it.send ? OpKind::Send : OpKind::Recv;
    e.peer = it.peer;
    e.bytes = static_cast<size_t>(it.count) * esize;
    e.desc.coll = static_cast<uint8_t>(Collective::Send);
    e.desc.dtype = static_cast<uint8_t>(dtype);
    e.desc.count = it.count;
    e.desc.seq = i < seqs.size() ? seqs[i] : next_p2p_seq(it.peer, it.send);
    if (it.send)
      e.src = reinterpret_cast<const char*>(it.ptr);
    else
      e.dst = reinterpret_cast<char*>(it.ptr);
    ops_.push_back(e);
    any = e.desc;
  }
  // What the executor's errors name: the collective the batch is (all_to_allv), else its last message.
  const CallDesc& call = as_call ? *as_call : any;
  const auto t0 = opts_.debug >= 2 ? Clock::now() : Clock::time_point{};
  try {
    exec_.check_peers_failed(call);
    size_t largest = 0;
    for (const ExecOp& e : ops_) largest = std::max(largest, e.bytes);
    exec_.begin_call(exec_.streams_call(kStreamNoEntry, static_cast<int64_t>(largest), largest), 0,
                     p2p_single_copy_min(static_cast<int64_t>(largest)));
    exec_.run_step(ops_, dtype, RedOp::Sum, call);
  } catch (const CommError& e) {
    fail_communicator(e);
    throw;
  }
  if (opts_.debug >= 2) {
    double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    std::fprintf(stderr, "commlib TRACE %s rank %d: batch of %zu sends/recvs done in %.1f us\n",
                 opts_.label.c_str(), rank_, items.size(), us);
  }
}

}  // namespace commlib
