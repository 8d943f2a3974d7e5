"""Rank side of test_a2av_peer_errors.py: a rank SIGKILLed under an all_to_all with split sizes on
host buffers, blocking or async, through the C++ entry or the Python route; the survivors' error
must name the dead rank and the collective with its call number, as every collective's does."""
import time

import numpy as np

import commlib
import commlib._C as _C
from commlib.testing.faults import arm_death

from host_async_entry_cases import python_route_only, python_route_spy


def kill_during_all_to_allv(comm, victim, route, async_op):
    """``victim`` dies before the third call of a fresh sub-communicator, an all_to_all with split
    sizes (``route``: "entry" or "python"; blocking or ``async_op``); the calls before it are
    another all_to_allv and an all_reduce, so the call is ``all_to_all #3``. A survivor returns
    (message, seconds, how the call went: "entry"/"python"); None on the victim."""
    sub = comm.split(0, timeout=10)
    P = sub.size
    ins = [r + 1 for r in range(P)]  # awkward: every block a different size
    outs = [sub.rank + 1] * P
    x = np.arange(sum(ins), dtype=np.float32)
    y = np.zeros(sum(outs), np.float32)

    def call():
        w = sub.all_to_all(y, x, output_splits=outs, input_splits=ins, async_op=async_op)
        if async_op:
            w.wait()
    with (python_route_only() if route == "python" else _nothing()):
        call()  # the call number #1 (and the warm-up a real job would have made)
        sub.all_reduce(np.ones(5, np.float32))  # #2
        # (the victim never makes the call: a rank sends its blocks at once, so a victim inside
        # the call could have delivered all its peers need before it dies)
        if arm_death(sub, victim):
            time.sleep(5)  # the kill arrives meanwhile
            return None
        entry_before = sum(_C.host_entry_counts()[k] for k in ("all_to_allv_blocking", "all_to_allv_async"))
        t = time.monotonic()
        with python_route_spy() as seen:
            try:
                call()
                return "no error", time.monotonic() - t, None
            except commlib.PeerError as e:
                took = time.monotonic() - t
                entry = sum(_C.host_entry_counts()[k] for k in ("all_to_allv_blocking", "all_to_allv_async"))
                how = "python" if seen == ["_all_to_allv"] else "entry" if entry == entry_before + 1 else "?"
                return str(e), took, how
            except commlib.CommError as e:
                return f"wrong type {type(e).__name__}: {e}", time.monotonic() - t, None


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
