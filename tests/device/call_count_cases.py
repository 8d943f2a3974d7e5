"""Rank side of test_call_counts.py: the driver calls one steady device collective makes on the
caller's thread (issue #37, item 1's host side), counted by the emulated device
(``_C.emulated_thread_driver_calls``: this thread's calls, with its device guards' gets and sets;
the watchdog's queries are its own thread's). Each call is counted alone and drained afterwards,
outside the count, so every call starts from the same state."""
import commlib._C as _C
import commlib.emulated as emu
from fast_device_call_cases import collective_calls
from kernel_path_cases import KERNEL_SETTINGS, with_settings


def _diff(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


def _counted_calls(call, n, async_op):
    """The driver calls of n calls (each counted alone, then drained), summed, and how many of
    them the C++ entry ran."""
    total = {}
    hits_before = _C.device_fast_path_counts()[1]
    for _ in range(n):
        before = _C.emulated_thread_driver_calls()
        work = call(async_op, None)
        after = _C.emulated_thread_driver_calls()
        for k, v in _diff(before, after).items():
            total[k] = total.get(k, 0) + v
        if work is not None:
            work.synchronize()
        work = None
        emu.current_stream().synchronize()
    return total, _C.device_fast_path_counts()[1] - hits_before


def steady_call_counts(comm, n=8):
    """{(collective, "blocking"|"async"): (driver calls of n steady calls, hits, results right,
    path)} on the kernel path, after three warm-up calls (the first fills the cache and sets the
    engine up, the second grows the event pool to the two events a drained loop uses)."""
    def run(sub):
        out = {}
        for name, (call, check) in collective_calls(sub).items():
            for mode in ("blocking", "async"):
                for _ in range(3):
                    w = call(mode == "async", None)
                    if w is not None:
                        w.synchronize()
                    w = None  # a work kept alive keeps its event out of the pool
                    emu.current_stream().synchronize()
                calls, hits = _counted_calls(call, n, mode == "async")
                out[(name, mode)] = (calls, hits, bool(check()), sub._device().last_path())
        return out
    return with_settings(comm, KERNEL_SETTINGS, run)
