"""Rank-side scenarios of the stream engine's own semantics: stream order and works. Its bad
arguments, mismatched calls, dead and silent peers and leaks are the error matrix's, which runs on
the host route and this one (tests/host/error_cases.py, the device route's own part in
tests/host/error_routes.py)."""
from __future__ import annotations

import os
import sys

import numpy as np

import commlib.emulated as emu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "host"))
from error_routes import DeviceRoute  # noqa: E402


def _warm_up(comm):
    """The scenarios below need the host free to run host calls in between device calls."""
    DeviceRoute.warm_up(comm)


def _side_channel(comm):
    """Another communicator of the same ranks, for host barriers that order the ranks around a
    device call: on ``comm`` itself a host call made by one rank while another makes a device
    call is a mismatch (host and device calls share one numbering)."""
    return comm.split(0)


def stream_order(comm):
    """Rank 0's all_reduce returns before its data is ready, and work enqueued after it on the
    same stream sees the result. Deterministic: rank 1 joins the call only after rank 0 checked
    (a host barrier orders them), so rank 0's call cannot have completed before."""
    r = comm.rank
    side = _side_channel(comm)
    _warm_up(comm)
    x = emu.from_numpy(np.full(1000, r + 1, np.float32))
    y = emu.empty(1000, "float32")
    x.numpy()
    if r == 0:
        w = comm.all_reduce(x, algorithm="ring", async_op=True)
        pending = not w.is_completed() and bool((x.host_view_unsynchronized() == 1).all())
        y.copy_(x)  # a later operation on the same stream
        side.barrier()  # host path: lets rank 1 join the device call
        ok = y.numpy().tolist() == [3.0] * 1000
        side.close()
        return pending, ok
    side.barrier()
    comm.all_reduce(x, algorithm="ring")
    side.close()
    return True, x.numpy().tolist() == [3.0] * 1000


def work_wait_orders_another_stream(comm):
    """work.wait(stream=s2) makes s2 wait for the call: a copy enqueued on s2 after it sees the
    result although rank 1 joins late (without the wait, s2 would copy the old data at once)."""
    r = comm.rank
    side = _side_channel(comm)
    _warm_up(comm)
    x = emu.from_numpy(np.full(64, r + 1, np.int32))
    x.numpy()
    s2 = emu.Stream()
    y = emu.empty(64, "int32", stream=s2)
    if r == 0:
        w = comm.all_reduce(x, async_op=True)
        w.wait(stream=s2)
        y.copy_(x, stream=s2)
        side.barrier()
    else:
        side.barrier()
        w = comm.all_reduce(x, async_op=True)
        w.wait(stream=s2)
        y.copy_(x, stream=s2)
    s2.synchronize()
    w.synchronize()
    side.close()
    return y.host_view_unsynchronized().tolist() == [3] * 64 and w.is_completed()


def many_async_calls(comm):
    """Calls enqueued back to back on two streams execute in call order with correct results."""
    P, r = comm.size, comm.rank
    s2 = emu.Stream()
    xs, works = [], []
    for k in range(12):
        s = s2 if k % 2 else emu.current_stream()
        x = emu.from_numpy(np.full(100 + k, r + k, np.int64), stream=s)  # uploaded in s's order
        xs.append(x)
        works.append(comm.all_reduce(x, algorithm=("ring", "direct", "auto")[k % 3], async_op=True, stream=s))
    for w in works:
        w.synchronize()
    return [k for k, x in enumerate(xs) if not (x.host_view_unsynchronized() == sum(q + k for q in range(P))).all()]
