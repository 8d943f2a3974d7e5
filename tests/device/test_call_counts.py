"""What one steady device collective costs on the host, counted, not timed (issue #37, item 1's host
side; docs/gpu.md, "The host side of one call"): through the C++ entry, every collective, blocking
and async, on the kernel path, makes exactly one kernel launch, one completion-event record (the
stream side's done word would remove it: docs/gpu.md), at most one event query (the
previous call's completion), one device guard
(one cudaGetDevice, no set), one capture-status query (whether the call is being captured into a
graph: docs/gpu.md "Collectives in CUDA graphs"; NCCL asks the same per call), and no allocation,
event creation, copy, host function or stream wait.
On the emulated device, counted on the caller's thread, in the rank pools of
test_device_collectives.py."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from call_count_cases import steady_call_counts  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402

# Per call, exactly (anything else counted, an allocation, copy or host function, fails).
PER_CALL = {"the kernel path's launch": 1, "cudaEventRecord": 1, "cudaGetDevice": 1,
            "cudaStreamGetCaptureInfo": 1}


def test_a_steady_call_is_one_launch_one_record_at_most_one_query(pool):
    n = 8
    for out in pool(2, env=DELAY_ENV).run(steady_call_counts, n, timeout=120):
        assert len(out) == 16, sorted(out)
        for (name, mode), (calls, hits, ok, path) in out.items():
            assert ok and path == "kernel" and hits == n, (name, mode, ok, path, hits)
            # The previous call's completion event, queried once when this call's enqueue retires
            # it (or not at all, where the watchdog's tick did first).
            queries = calls.pop("cudaEventQuery", 0)
            assert queries <= n, (name, mode, queries)
            assert calls == {k: v * n for k, v in PER_CALL.items()}, (name, mode, calls)
