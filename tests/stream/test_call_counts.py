"""What steady device collectives cost on the host, counted, not timed (issue #37, items 1 and 5;
docs/gpu.md, "One call from Python, and the per-call cost budget (issue #37)"): through the C++
entry, every collective, blocking and async, on the kernel path, makes exactly one kernel launch,
one device guard (one cudaGetDevice, no set) and one capture-status query (whether the call is being
captured into a graph: docs/gpu.md "Collectives in CUDA graphs"; NCCL asks the same per call), over
1000 calls back to back: no event record or query (the call's completion is the done word its
kernel's last block stores), and no event creation, copy, host function or stream wait; and no heap
allocation by commlib's C++ code (counted by a wrapper of operator new: csrc/common/alloc_count.h),
async calls' work handles included (a pooled handle the caller let go of is re-armed:
csrc/bindings/device_work_pool.h; the caller holds its last KEPT works, as a training step holds its
buckets'). What asks for more pays only then: a wait() on another stream or a call on another stream
than the previous one is one stream wait on the done word (cuStreamWaitValue64), synchronize() and
is_completed() read the word (no device call), and avg (a divide after the launch) records its
event. On the emulated device, counted on the caller's thread, in the rank pools of
test_device_collectives.py."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from call_count_cases import (KEPT, asked_call_counts, completion_events, copy_recv_counts, late_peer_polls,  # noqa: E402
                              launch_counts,
                              mapped_candidate_lookups, mapped_steady_counts, plan_lookups, pooled_handles, steady_call_counts,
                              steady_calls_cuda)
from entry_stream_cases import steady_named_stream_counts  # noqa: E402
from foreign_array_cases import foreign_steady_call_counts  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402

# The counting pools: their communicators never make a device call themselves, so a counted
# call's engine is alone on its rank's device (with a second engine there, every launch also
# records an event to chain the engines' launches: stream/kernel_occupancy.cc, LaunchChain).
# Shared with test_call_structure.py. Other modules' device calls on the shared pools'
# communicators (test_device_errors.py's, test_device_p2p.py's) made these counts depend on the
# order the modules run in.
COUNTING = "counting"

# Per call, exactly (anything else counted, an event record or query, an allocation, copy, host
# function or stream wait, fails).
PER_CALL = {"the kernel path's launch": 1, "cudaGetDevice": 1, "cudaStreamGetCaptureInfo": 1}
STEADY = 1000
QUEUE_GROWTHS = 3 * (STEADY // 16).bit_length()  # three queues, each doubling from 16 to hold STEADY


def test_a_steady_call_is_one_launch_and_no_event(pool):
    for out in pool(2, env=DELAY_ENV, own=COUNTING).run(steady_call_counts, STEADY, timeout=300):
        assert len(out) == 16, sorted(out)
        for (name, mode), (calls, hits, ok, path, allocs) in out.items():
            assert ok and path == "kernel" and hits == STEADY, (name, mode, ok, path, hits)
            assert calls == {k: v * STEADY for k, v in PER_CALL.items()}, (name, mode, calls)
            # No heap allocation per call by commlib's C++ code, blocking or async: an async call's
            # work handle (a DeviceWork and pybind11's registration of its Python object, two
            # allocations when made) is a pooled one re-armed. The per-call queues (the engine's
            # calls in flight and waits, the cache's held buffers: common/ring_queue.h) allocate only
            # when they double past their largest size, from 16 slots: at most QUEUE_GROWTHS times
            # however the calls overlap.
            assert 0 <= allocs <= QUEUE_GROWTHS, (name, mode, allocs)


def test_a_held_work_keeps_its_handle_and_a_kept_one_outlives_close(pool):
    """Pooled async handles are re-armed only when nothing holds or observes them (device_work_pool.h):
    a held work keeps its own call while later calls reuse a handle, a weakly referenced one is never
    re-armed, and one kept past close still answers."""
    for out in pool(2, env=DELAY_ENV).run(pooled_handles, timeout=120):
        assert out == (True, True, True, True, True), out


def test_a_steady_call_looks_no_device_plan_up(pool):
    """The kernel path's device plan is kept in the prepared call (csrc/stream/device_path.h,
    KernelPlanSlot): a cached call's launches make no lookup by call shape; a new shape makes one."""
    n = 20
    for out in pool(2, env=DELAY_ENV, own=COUNTING).run(plan_lookups, n, timeout=120):
        assert out.pop("new shape") >= 1, out
        assert len(out) == 16 and all(v == (0, n) for v in out.values()), out


@pytest.mark.parametrize("P", [2, 4])
def test_a_small_call_is_one_block_and_one_round_trip(pool, P):
    """The kernel's side of a call (docs/gpu.md "The GPU time of one call"), per launch. An 8 B
    direct all_reduce (every chunk LL) runs on ONE block: no grid barrier, and its descriptor check
    folded into the data handshakes (plan_call_check.cuh): no exchange before the first step, each
    peer's descriptor compared at its chunk; what it waits on a peer for: P - 1 descriptors, P - 1
    LL chunks, P - 1 slots handed back (a send's gate). What it accesses of host memory: nothing
    read but the abort word's polls inside waits (counted as host reads, as the one-sided plans'
    are, and apart: how many depends on how long a wait spins; a peer late to the call makes its
    peers' launches poll, each poll a host read), and one write per item done (the
    block's progress word, for the watchdog) and one for the done word: its 3P - 2 items (P - 1 sends
    and receives, a copy, P - 1 reductions) + 1. The blocks' chunk counts are device memory (their
    read-back from host memory was a PCIe round trip at the end of every launch: docs/gpu.md "The GPU
    time of one call"); no launch reads host memory. A 32 KiB direct all_reduce (slot protocol)
    keeps the grid (its chunks split over every block: 4 on the emulated device), the
    exchange and a grid barrier before each of its 1 + 2 + (P - 1) steps; a small ring at 4 ranks
    (its plan does not join every rank) is one block with the exchange."""
    small, large, ring = ("direct", 2), ("direct", 8192), ("ring", 2 * P)
    cases = [small, large] + ([ring] if P == 4 else [])
    for out in pool(P, env=DELAY_ENV, own=COUNTING).run(launch_counts, cases, timeout=120):
        assert all(right for _, right in out.values()), out
        per = {case: counts for case, (counts, _) in out.items()}
        assert per[small] == {"message_blocks": 1, "grid_barriers": 0, "check_exchanges": 0,
                              "folded_checks": P - 1, "peer_waits": 3 * (P - 1), "host_reads": 0,
                              "host_writes": 3 * P - 1}, per[small]
        assert per[large]["host_reads"] == 0, per[large]
        grid = 4
        assert per[large]["message_blocks"] == grid and per[large]["check_exchanges"] == 1, per[large]
        assert per[large]["grid_barriers"] == grid * (1 + 2 + (P - 1)) and per[large]["folded_checks"] == 0, per[large]
        if P == 4:
            assert per[ring] == {"message_blocks": 1, "grid_barriers": 0, "check_exchanges": 1, "folded_checks": 0,
                                 "peer_waits": per[ring]["peer_waits"], "host_reads": 0,
                                 "host_writes": per[ring]["host_writes"]}, per[ring]
    if P == 2:  # (one pool: the late peer's case in the same ranks)
        for rank, out in enumerate(pool(P, env=DELAY_ENV).run(late_peer_polls, [small, large], timeout=120)):
            for case, (polls, reads, right) in out.items():
                assert right and reads == polls, (rank, case, polls, reads)
                assert rank == P - 1 or polls > 0, (rank, case, polls, reads)  # the punctual rank waited


def test_a_steady_auto_call_that_may_map_looks_no_plan_up(pool):
    """An auto all_reduce that is a mapped candidate (csrc/stream/stream_one_sided.cc) agrees on its
    route per call, but keeps the plans of every route in the prepared call (PreparedCall::mapped_plan,
    slots_plan): no device-plan and no plan-cache lookup per steady call, mapped or staged (in the
    arena, where the cost model's choice is the fused two-shot staged too: policy/device_auto.h)."""
    n = 5
    for out in pool(2, env=DELAY_ENV, own=COUNTING).run(mapped_candidate_lookups, n, timeout=120):
        assert out["mapped"] == (0, 0, n, "mapped_fused_two_shot", True), out
        assert out["staged"] == (0, 0, n, "mapped_fused_two_shot", True), out


def test_a_steady_one_sided_call_agrees_once_and_asks_the_driver_once_at_most(pool):
    """The one-sided all_reduces agree on their route with the peers per call (PeerBuffers::agree,
    docs/gpu.md "One call from Python, and the per-call cost budget (issue #37)"): ONE host wait for
    the peers per call, both buffers' entries written first (it was one per buffer: two rounds of
    every rank's host, each a 60-100 us sleep when a peer was not there within the spins, the GPU
    run's ~100 us enqueues), and besides the steady call's launch, guard and capture query, one
    pointer query per call for a cudaMalloc'd buffer (its buffer id: freed and reallocated at the
    same address is another allocation; in place, input and output are one allocation: one query, it
    was two) and none for a symmetric pool block (its arena is the registry's own). And no heap
    allocation per call, as the message plans' (test_a_steady_call_is_one_launch_and_no_event): the
    agreement's views and route, and the mapped table's key, are the engine's own, refilled in place
    (stream/one_sided_scratch.h, KernelPath::mapped_words_), and the peer wait is a template, no
    std::function (they were about 6 allocations per call). What may allocate is what the message
    plans' may: the engine's ring queues doubling past their largest size, which they never shrink
    from, so at most queue_growths_n over the six runs together (the first run's, after a 3-call
    warm-up)."""
    n = 40
    queue_growths_n = 3 * (n // 16).bit_length()  # three queues, each doubling from 16 to hold n
    for out in pool(2, env=DELAY_ENV, own=COUNTING).run(mapped_steady_counts, n, timeout=120):
        assert len(out) == 6, sorted(out)
        for (algo, kind), (calls, hits, waits, right, _, _) in out.items():
            assert right and hits == n, (algo, kind, hits, right)
            queries = {"cuPointerGetAttributes": n} if kind == "array" else {}
            assert calls == {**{k: v * n for k, v in PER_CALL.items()}, **queries}, (algo, kind, calls)
            assert waits == n, (algo, kind, waits)
        # The agreement's sleeps (PeerBuffers::back_off, its counter `agree_sleeps`) are not asserted:
        # whether a peer reaches a steady call within the spins and yields is the scheduler's (none
        # here on a quiet machine, more whenever a rank of this pool or another worker's is
        # descheduled: a CI with two workers on two cores), a timing, not a count of calls.
        allocs = {case: v[4] for case, v in out.items()}
        assert all(a >= 0 for a in allocs.values()) and sum(allocs.values()) <= queue_growths_n, allocs


@pytest.mark.parametrize("kind", ["cai", "dlpack"])
def test_foreign_arrays_cost_what_commlibs_own_do(pool, kind):
    """Other libraries' arrays (csrc/bindings/foreign_arrays.cc; foreign_arrays.py's views of emulated
    memory) through the entry: the same launch, guard and capture query, no allocation per blocking
    call; a __cuda_array_interface__ names no device, so each of its buffers costs one pointer query
    (cudaPointerGetAttributes on CUDA), DLPack's none (it names its device)."""
    queries = {"cai": {"cuPointerGetAttributes": 2}, "dlpack": {}}[kind]  # two buffers a call
    n = STEADY // 2
    for out in pool(2, env=DELAY_ENV, own=COUNTING).run(foreign_steady_call_counts, kind, n, timeout=300):
        assert len(out) == 4, sorted(out)
        for (name, mode), (calls, hits, ok, path, allocs) in out.items():
            assert ok and path == "kernel" and hits == n, (kind, name, mode, ok, path, hits)
            assert calls == {k: v * n for k, v in {**PER_CALL, **queries}.items()}, (kind, name, mode, calls)
            assert 0 <= allocs <= QUEUE_GROWTHS, (kind, name, mode, allocs)


@pytest.mark.parametrize("on", ["named", "own", "both"])
def test_calls_on_a_named_stream_cost_what_current_stream_calls_do(pool, on):
    """stream= read in C++ (csrc/bindings/named_stream.cc), or a __cuda_array_interface__'s own
    stream (its views of emulated memory naming an emulated stream): the same launch, guard and
    capture query per call, no event, no stream wait (every call on that one stream), no allocation;
    the interface's pointer queries as above. Both, the calls on stream= and the views naming
    another stream: one event record there and one stream wait on it more (the interface's rule:
    csrc/bindings/device_own_stream.cc), inside one device guard of their own, the event made once."""
    queries = {"named": {}, "own": {"cuPointerGetAttributes": 2},
               "both": {"cuPointerGetAttributes": 2, "cudaEventRecord": 1, "cudaStreamWaitEvent": 1,
                        "cudaGetDevice": 2}}[on]
    n = STEADY // 2
    for out in pool(2, env=DELAY_ENV, own=COUNTING).run(steady_named_stream_counts, on, n, timeout=300):
        assert len(out) == 4, sorted(out)
        for (name, mode), (calls, hits, ok, path, allocs) in out.items():
            assert ok and path == "kernel" and hits == n, (on, name, mode, ok, path, hits)
            assert calls == {k: v * n for k, v in {**PER_CALL, **queries}.items()}, (on, name, mode, calls)
            # (both: the emulated device's record and stream wait queue an operation each, which it
            # allocates, about 2.4 a call; commlib's side allocates nothing, as CUDA's calls do not)
            assert 0 <= allocs <= QUEUE_GROWTHS + (3 * n if on == "both" else 0), (on, name, mode, allocs)


def test_waits_on_another_stream_are_one_stream_wait_on_the_done_word(pool):
    n = 20
    for out in pool(2, env=DELAY_ENV, own=COUNTING).run(asked_call_counts, n, timeout=120):
        assert out.pop("right"), out
        for case, (calls, _) in out.items():
            if case != "avg":
                assert "cudaEventQuery" not in calls and "cudaEventSynchronize" not in calls, (case, calls)
        assert out["wait"][0] == {"cuStreamWaitValue64": n, "cudaGetDevice": n}, out["wait"]
        calls, hits = out["alternate"]
        assert hits == n, out["alternate"]  # both streams' calls cached
        # Every call but the first (the previous call ran on its stream) switches streams.
        assert calls == {**{k: v * n for k, v in PER_CALL.items()}, "cuStreamWaitValue64": n - 1}, calls
        assert out["synchronize"][0] == {} and out["is_completed"][0] == {}, out
        # avg: its divide runs after the launch, so its completion is an event, recorded per call and
        # queried at most once by a later call's retire (created while the pool has none free: back
        # to back, the calls in flight hold theirs); the divide is gated on the stop word mirrored
        # into a device word by one 8-byte copy (not read from host memory by each of its blocks).
        calls, hits = out["avg"]
        assert hits == n and calls.pop("cudaEventQuery", 0) <= n and calls.pop("cudaEventCreate", 0) <= n, calls
        assert calls == {**{k: v * n for k, v in PER_CALL.items()}, "cudaEventRecord": n,
                         "a gated divide kernel launch": n, "cudaMemcpyAsync": n}, calls


def test_a_completion_event_orders_another_stream_and_costs_one_record(pool):
    """DeviceWork.completion_event() (commlib/device/completion.py): a stream made to wait on it
    sees the call's result; asking costs one stream wait on the done word, one event created and
    recorded, on the engine's own stream, and nothing when not asked (the steady test above)."""
    n = 10
    for calls, seen, done in pool(2, env=DELAY_ENV, own=COUNTING).run(completion_events, n, timeout=120):
        assert seen == [True, True] and done == [True, True], (seen, done)
        assert calls == {"cuStreamWaitValue64": n, "cudaEventCreate": n, "cudaEventRecord": n,
                         "cudaGetDevice": n}, calls


@pytest.mark.gpu
def test_steady_calls_on_cuda_complete_by_the_done_word(pool):
    """On GPU 0, 1000 steady blocking and 1000 async calls through the entry (the async ones
    holding their last KEPT works), no allocation per call either way, every work complete by its
    done word, and a wait() on another stream ordered by the word. First run on an H200 (session 14,
    blocking allocations only: 1999 hits of 2000, as the warm-up used another op than the measured
    calls, a cache miss of the test's own making); every work completed. The async count has not
    run on a GPU yet."""
    pytest.importorskip("torch")
    for rank, (hits, allocs, async_allocs, right, seen) in enumerate(pool(2, env={"COMMLIB_TIMEOUT": "20"}).run(
            steady_calls_cuda, STEADY, timeout=240)):
        assert hits == 2 * STEADY + 2 * KEPT and 0 <= allocs <= QUEUE_GROWTHS, (rank, hits, allocs)
        assert 0 <= async_allocs <= QUEUE_GROWTHS, (rank, async_allocs)
        assert right and seen, (rank, right, seen)


@pytest.mark.parametrize("setting", [None, "mirror", "gated", "ungated", "driver"])
def test_the_copy_paths_data_operations_follow_the_setting(pool, setting):
    """COMMLIB_DEVICE_COPY_RECV (docs/gpu.md "The copy path's large-message regression"): mirror,
    the default (None: unset), every copy and reduction of a step is a kernel gated on a device word,
    each after one copy of the stop word into that word (one per gated kernel, counted against
    gated's); gated, the same kernels reading the stop word itself, no copy of it (the H200's
    regression, a diagnostic); ungated, the same kernels without a gate; driver, the plain copies
    are the driver's (cudaMemcpyAsync) and the reductions ungated kernels. The results are right in
    all of them (test_mismatch_data.py: the default and gated keep a mismatched call from writing)."""
    for (counts, ok), (baseline, _) in pool(2, env=DELAY_ENV, own=COUNTING).run(
            copy_recv_counts, setting, timeout=60):
        assert ok, counts
        gated = counts.get("a gated copy kernel launch", 0) + counts.get("a gated reduction kernel launch", 0)
        kernels = counts.get("a copy kernel launch", 0) + counts.get("a reduction kernel launch", 0)
        assert counts.get("a gated reduction kernel launch", 0) + counts.get("a reduction kernel launch", 0) > 0, counts
        if setting in (None, "gated", "mirror"):
            assert gated > 0 and kernels == 0 and counts.get("a gated copy kernel launch", 0) > 0, counts
            assert gated == baseline.get("a gated copy kernel launch", 0) + \
                baseline.get("a gated reduction kernel launch", 0), (counts, baseline)
            mirrored = counts.get("cudaMemcpyAsync", 0) - baseline.get("cudaMemcpyAsync", 0)
            assert mirrored == (0 if setting == "gated" else gated), (counts, baseline)
        else:
            assert gated == 0 and kernels > 0, counts
            copies = counts.get("a copy kernel launch", 0)
            assert (copies == 0) == (setting == "driver"), counts
