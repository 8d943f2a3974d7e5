"""all_to_all with split sizes through the C++ entry (issue #37, items 1 and 2;
csrc/bindings/device_all_to_allv.cc): a new shape at every call, on the current stream, a named one
and an interface's own, blocking and async, never reaching the Python route once the engine is set
up; exact at 2 and 3 ranks with zeros, ones, primes and fewer elements than ranks; its steady
calls cost the driver calls the Python route's batch costs; a wrong argument after such calls
raises naming it with nothing enqueued. And a call on ``stream=`` whose buffer's
``__cuda_array_interface__`` names another stream waits for that one (CAI v3;
csrc/bindings/device_own_stream.cc). On the emulated device, in the rank pools of
test_device_collectives.py."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from entry_a2av_cases import (A2AV_SEGMENT, a2av_bad_arguments, a2av_counts, a2av_from_the_entry,  # noqa: E402
                              stream_waits_on_the_interfaces_stream)
from test_device_collectives import DELAY_ENV  # noqa: E402

from a2av_argument_errors import A2AV_ARGUMENT_ERRORS  # noqa: E402


@pytest.mark.parametrize("P", [2, 3])
def test_all_to_all_with_splits_never_reaches_the_python_route(pool, P):
    calls = 4
    for out in pool(P, env=DELAY_ENV).run(a2av_from_the_entry, calls, timeout=120):
        assert sorted(out) == ["current", "interface's stream", "stream="], out
        for case, (python_calls, ran, made, waits_ok, right) in out.items():
            assert made == 2 * calls, (case, made)
            assert (python_calls, ran, waits_ok, right) == ([], made, True, True), (case, out[case])


def test_all_to_all_with_splits_costs_what_the_python_routes_batch_costs(pool):
    n = 200
    # A batch's device work per call, from C++ as from the route: the own block's copy and the
    # batch's (a gated copy kernel per message pair, memcpys: the chunk's into the peer's inbox, the
    # own block's, and the stop word's into the device word the gated kernel reads (the default,
    # COMMLIB_DEVICE_COPY_RECV=mirror), stream memory operations, host functions), one capture
    # query, one event record (a batch completes by its event: docs/gpu.md).
    # Counted in segments of k calls between (uncounted) synchronizations, so at most k + 1 calls are
    # ever in flight: the engine's event pool may grow to them (an event made, a guard, a free each:
    # k + 1 at most; one per call when an event is made per call), and event queries are the retire's
    # polls: each call's begin queries the calls it retires (n in all) and the first one not done yet
    # (one a call), 2n, plus one for each call the watchdog retired between a poll and its pop.
    pinned = {"a gated copy kernel launch": n, "cuStreamWaitValue64": 3 * n, "cuStreamWriteValue64": 2 * n,
              "cudaEventRecord": n, "cudaLaunchHostFunc": 2 * n, "cudaMemcpyAsync": 3 * n,
              "cudaStreamGetCaptureInfo": n}
    few = A2AV_SEGMENT + 1
    at_most = {"cudaEventQuery": 2 * n + few, "cudaGetDevice": 2 * n + few, "cudaEventCreate": few,
               "cudaFreeAsync": few}
    for entry, route, python_calls, ran, right in pool(2, env=DELAY_ENV).run(a2av_counts, n, timeout=120):
        assert (python_calls, ran, right) == (0, n, True), (python_calls, ran, right)
        for counts in (entry, route):
            assert {k: counts.get(k, 0) for k in pinned} == pinned, counts
            assert counts.get("cudaGetDevice", 0) >= 2 * n, counts
            assert set(counts) <= set(pinned) | set(at_most), counts
            over = {k: counts[k] for k, v in at_most.items() if counts.get(k, 0) > v}
            assert not over, (over, counts)  # no event made per call


def test_a_wrong_all_to_all_argument_after_entry_calls_raises_naming_it_with_nothing_enqueued(pool):
    want = dict(A2AV_ARGUMENT_ERRORS, **{"stream type": ("TypeError", "stream: expected a commlib.emulated.Stream, got str")})
    for out in pool(2, env=DELAY_ENV).run(a2av_bad_arguments, timeout=60):
        assert [case for case, *_ in out] == list(want), out
        for case, error, calls in out:
            assert error is not None and error[0] == want[case][0] and error[1].startswith(want[case][1]), (case, error)
            assert calls == {}, (case, calls)


@pytest.mark.parametrize("P,first", [(2, "all_reduce"), (3, "all_reduce"), (2, "all_to_all")])
def test_a_call_on_another_stream_waits_for_the_interfaces_stream(pool, P, first):
    for rights, python_calls in pool(P, env=DELAY_ENV).run(stream_waits_on_the_interfaces_stream, first,
                                                           timeout=120):
        assert rights == [True, True, True, True] and python_calls == 0, (rights, python_calls)
