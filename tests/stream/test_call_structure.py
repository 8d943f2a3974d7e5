"""The structure of one device all_reduce's host side (issue #25: its host time was the bottleneck
on a GPU): the driver calls it makes, counted by the emulated device, never its time. A kernel-path
call on the stream of the previous call is one launch: no event record (its completion is the
kernel's done word), no host function, no second stream, no event wait, no copies or flag writes.
Calls on another stream than the previous call still wait for it, on the done word
(cuStreamWaitValue64; bad arguments after cached calls: test_fast_device_call.py).
On the emulated device, in the rank pools of test_device_collectives.py."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from call_structure_cases import (calls_on_alternating_streams, driver_calls_per_call,  # noqa: E402
                                  enqueue_beside_a_held_query)
from kernel_path_cases import check_kernel_and_copy  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402
from test_call_counts import COUNTING  # noqa: E402  (pools whose communicators make no device call)


def test_a_kernel_path_call_is_one_launch_and_no_record(pool):
    n = 10
    for per_path in pool(2, env=DELAY_ENV, own=COUNTING).run(driver_calls_per_call, n, timeout=60):
        kernel, copy = check_kernel_and_copy(per_path)
        assert kernel == {"the kernel path's launch": n}, kernel
        # The counters count: the copy path's ring moves chunks with copies and flag waits.
        assert copy.get("cudaMemcpyAsync", 0) >= n and copy.get("cuStreamWaitValue64", 0) >= n, copy


def test_a_call_on_another_stream_waits_for_the_previous_call(pool):
    n = 6
    for calls, ok in pool(2, env=DELAY_ENV, own=COUNTING).run(calls_on_alternating_streams, n, timeout=60):
        assert ok
        assert calls == {"the kernel path's launch": n, "cuStreamWaitValue64": n}, calls


def test_an_enqueue_does_not_wait_behind_the_watchdogs_event_query(pool):
    # The watchdog queries events without the engine's mutex (StreamEngine::retire_completed): a
    # query stuck in the driver (a large call running) no longer holds up the next call's begin().
    # On the copy path: a kernel-path call has no event to query (its done word is a host load).
    for held_during_call, ok in pool(2, env=DELAY_ENV, own=COUNTING).run(enqueue_beside_a_held_query, timeout=60):
        assert ok and held_during_call
