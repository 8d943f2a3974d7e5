"""A call captured into a graph on a stream that is capturing while its buffer's
``__cuda_array_interface__`` names a stream that is not (issue #37; docs/gpu.md "Stream capture and
CUDA graphs"): CUDA refuses a plain cross-capture event wait (cudaErrorStreamCaptureIsolation), so
the call's stream waits through an external event wait node (cudaEventWaitExternal) on an event the
graph holds (csrc/bindings/device_own_stream.cc). On the emulated device, which enforces CUDA's rule
(tests/device/test_emulated_capture.py: the refused and the allowed wait)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from capture_own_stream_cases import captured_call_waits_for_the_interfaces_stream  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402


@pytest.mark.timeout(120)
@pytest.mark.parametrize("P", [2, 3])
def test_a_captured_call_waits_for_the_interfaces_stream_through_an_external_node(pool, P):
    for eager, rights, status, python_calls, a2a_error, a2a_status in pool(P, env=DELAY_ENV).run(
            captured_call_waits_for_the_interfaces_stream, timeout=90):
        assert eager, "the eager warm-up's result is wrong"
        # captured (not invalidated: a plain wait would have been cudaErrorStreamCaptureIsolation), from
        # the entry; the first replay, launched while the interface's stream was still copying the
        # input, waits for it; later replays run in the caller's order on the same stream.
        assert status == "active" and python_calls == 0, (status, python_calls)
        assert rights == [True, True, True], rights
        # all_to_all with splits is point-to-point, which refuses capture: its own error, before any
        # wait could invalidate the capture
        assert a2a_error.startswith("CommError") and "cannot capture point-to-point" in a2a_error, a2a_error
        assert a2a_status == "active", a2a_status
