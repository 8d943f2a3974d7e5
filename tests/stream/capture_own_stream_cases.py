"""Rank side of test_capture_own_stream.py: a call captured into a graph on stream ``t`` whose buffer's
``__cuda_array_interface__`` names another stream ``s`` that is not capturing (csrc/bindings/
device_own_stream.cc wait_for_own_stream: an external event wait node), with a spy on the Python
route (DeviceRoute.run and .p2p)."""
import numpy as np

import commlib
import commlib.emulated as emu
from entry_a2av_cases import route_spy
from entry_stream_cases import same_stream
from foreign_arrays import CudaArrayView
from kernel_path_cases import KERNEL_SETTINGS, with_settings


def captured_call_waits_for_the_interfaces_stream(comm, count=4096, replays=3):
    """An all_reduce of ``count`` floats on ``t`` (stream=) whose interface names ``s``: warmed up
    eagerly, then captured while ``s`` is still copying the input (behind 50 other copies) and
    replayed at once, then ``replays - 1`` more times, each after the last (the caller's order);
    then an all_to_all with splits captured the same way, which point-to-point refuses. Returns
    (eager result right, [each replay's result right], the capture's status after it, the Python
    route's calls during the capture, the all_to_all's error)."""
    def run(sub):
        P, r = sub.size, sub.rank
        s, t = emu.Stream(), emu.Stream()
        junk = emu.from_numpy(np.zeros(16, np.float32))

        def slow_copy(dst, src):  # a copy on s behind 50 others: about 1 ms of the emulated delay
            for _ in range(50):
                junk.copy_(junk, stream=s)
            dst.copy_(src, stream=s)

        def call(x):
            sub.all_reduce(CudaArrayView(x, stream=s.handle), stream=same_stream(t))

        x = emu.from_numpy(np.zeros(count, np.float32))
        src = emu.from_numpy(np.full(count, r + 1, np.float32))
        emu.current_stream().synchronize()
        slow_copy(x, src)  # the warm-up: the same call, eager
        call(x)
        t.synchronize()
        eager = bool((x.host_view_unsynchronized() == P * (P + 1) / 2).all())
        s.synchronize()

        src = emu.from_numpy(np.full(count, 10 * (r + 1), np.float32))
        emu.current_stream().synchronize()
        g = emu.Graph()
        with route_spy() as seen:
            slow_copy(x, src)  # still running when the call is captured, and when the graph is launched
            g.capture_begin(t)
            call(x)
            status = emu.capture_status(t)[0]
            g.capture_end()
        rights, want = [], 10 * P * (P + 1) / 2
        for _ in range(replays):  # in place: every replay sums the ranks' last results again
            g.replay(t)
            t.synchronize()
            rights.append(bool((x.host_view_unsynchronized() == want).all()))
            want *= P
        s.synchronize()

        ins = [1] * P
        a, b = emu.from_numpy(np.arange(P, dtype=np.int64)), emu.from_numpy(np.zeros(P, np.int64))
        emu.current_stream().synchronize()
        sub.all_to_all(b, CudaArrayView(a, stream=s.handle), output_splits=ins, input_splits=ins, stream=same_stream(t))
        t.synchronize()
        g2 = emu.Graph()
        g2.capture_begin(t)
        try:
            sub.all_to_all(b, CudaArrayView(a, stream=s.handle), output_splits=ins, input_splits=ins,
                           stream=same_stream(t))
            a2a_error = "no error"
        except (commlib.CommError, RuntimeError) as e:
            a2a_error = f"{type(e).__name__}: {e}"
        a2a_status = emu.capture_status(t)[0]
        try:
            g2.capture_end()
        except RuntimeError as e:
            a2a_status += f"; end: {e}"
        return eager, rights, status, len(seen), a2a_error, a2a_status
    return with_settings(comm, KERNEL_SETTINGS, run)
