"""Rank side of test_keyword_errors.py: one table of wrong keyword arguments, each call made on host
buffers and on the emulated device, through the C++ entry and with the entry declining everything
(the Python route alone), after the same calls ran right (so the entry holds them): the error each
raises, and what it sent (the emulated device's driver calls on this thread, the C++ entry's host
runs)."""
import numpy as np

import commlib._C as _C
import commlib.emulated as emu
from python_route import python_route_only
from kernel_path_cases import KERNEL_SETTINGS, with_settings


# (label, call(comm, x, y, peer)) of calls that differ from a right one in one keyword argument only.
BAD_KEYWORDS = [
    ("async_op text", lambda c, x, y, p: c.all_reduce(x, async_op="yes")),
    ("async_op int", lambda c, x, y, p: c.all_reduce(x, async_op=1)),
    ("async_op None", lambda c, x, y, p: c.all_gather(y, x[:2], async_op=None)),
    ("async_op text, broadcast", lambda c, x, y, p: c.broadcast(x, root=0, async_op="no")),
    ("async_op text, all_to_all", lambda c, x, y, p: c.all_to_all(y, x, async_op="yes")),
    ("async_op text, all_to_all with splits",
     lambda c, x, y, p: c.all_to_all(y, x, output_splits=[2, 2], input_splits=[2, 2], async_op="yes")),
    ("async_op text, barrier", lambda c, x, y, p: c.barrier(async_op="yes")),
    ("async_op text, sendrecv", lambda c, x, y, p: c.sendrecv(x, p, y[:4], p, async_op="yes")),
    ("output_splits an int", lambda c, x, y, p: c.all_to_all(y, x, output_splits=4, input_splits=[2, 2])),
    ("output_splits text", lambda c, x, y, p: c.all_to_all(y, x, output_splits=["2", "2"], input_splits=[2, 2])),
    ("input_splits floats", lambda c, x, y, p: c.all_to_all(y, x, output_splits=[2, 2], input_splits=[2.0, 2.0])),
    ("input_splits bools", lambda c, x, y, p: c.all_to_all(y, x, output_splits=[1, 3], input_splits=[True, 3])),
]


def bad_keywords(comm):
    """{(where, route): [(label, error type, message, {driver call: how many} the call made, host entry runs)]}
    at 2 ranks (the splits are 2 ranks'), and whether a right all_reduce after them all is exact."""
    def run(sub):
        assert sub.size == 2
        peer = 1 - sub.rank
        out, exact = {}, True
        for where in ("host", "device"):
            mk = (lambda a: a) if where == "host" else emu.from_numpy
            for route in ("entry", "python"):
                rows = []
                for label, bad in BAD_KEYWORDS:
                    # the right calls first (the entry then holds them on device buffers)
                    x2, y2 = mk(np.ones(4, np.float32)), mk(np.zeros(4, np.float32))
                    sub.all_reduce(x2)
                    sub.all_gather(y2, x2[:2])
                    sub.broadcast(x2, root=0)
                    sub.all_to_all(y2, x2)
                    sub.all_to_all(y2, x2, output_splits=[2, 2], input_splits=[2, 2])
                    sub.barrier()
                    sub.sendrecv(x2, peer, y2, peer)
                    if where == "device":
                        emu.current_stream().synchronize()
                    host_runs = sum(_C.host_entry_counts().values())
                    calls = _C.emulated_thread_driver_calls()
                    try:
                        if route == "python":
                            with python_route_only():
                                w = bad(sub, x2, y2, peer)
                        else:
                            w = bad(sub, x2, y2, peer)
                        if w is not None:
                            w.wait()
                        rows.append((label, None, None, {}, 0))
                    except (TypeError, ValueError) as e:
                        after = _C.emulated_thread_driver_calls()
                        sent = {k: after[k] - calls.get(k, 0) for k in after if after[k] != calls.get(k, 0)}
                        rows.append((label, type(e).__name__, str(e), sent,
                                     sum(_C.host_entry_counts().values()) - host_runs))
                out[(where, route)] = rows
                z = mk(np.full(4, sub.rank + 1, np.float32))
                sub.all_reduce(z)
                if where == "device":
                    emu.current_stream().synchronize()
                exact &= (z.numpy() if where == "device" else z).tolist() == [3.0] * 4
        return out, exact
    return with_settings(comm, KERNEL_SETTINGS, run)
