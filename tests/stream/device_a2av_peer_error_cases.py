"""Rank side of test_device_a2av_peer_errors.py: a rank SIGKILLed under an all_to_all with split
sizes on emulated device buffers (the stream engine's point-to-point batch, numbered as a
collective: StreamEngine::all_to_allv), blocking or async, through the C++ entry
(bindings/device_all_to_allv.cc) or the Python route (DeviceRoute.p2p); the survivors' error must
name the dead rank and the collective with its call number, as every collective's does. Host and
device calls are interleaved before it on the one communicator, so a numbering that differed
between them (or between the routes) would show as a MismatchError or a wrong number."""
import contextlib
import time

import numpy as np

import commlib
import commlib._C as _C
import commlib.emulated as emu
from commlib.core import communicator
from commlib.testing.faults import arm_death
from entry_a2av_cases import route_spy
from python_route import python_route_only

# The call the victim dies before: device all_reduce (#1, the engine's set-up), the a2av under test
# (#2), a host all_to_all with splits (#3), a device all_reduce (#4), then the a2av again (#5).
KILLED_CALL = 5


def _a2av_arrays(sub):
    """Input and output of an all_to_all whose every block differs in size (rank i sends rank j
    i + j + 1 elements), values (sender, receiver, index); and the output this rank must get."""
    P, r = sub.size, sub.rank
    ins = [r + j + 1 for j in range(P)]
    outs = [i + r + 1 for i in range(P)]
    x = np.concatenate([np.arange(ins[j], dtype=np.int64) + 1000 * r + 100 * j for j in range(P)])
    want = np.concatenate([np.arange(outs[i], dtype=np.int64) + 1000 * i + 100 * r for i in range(P)])
    return ins, outs, x, want


def kill_during_device_all_to_allv(comm, victim, route, async_op):
    """``victim`` dies before call #5 of a fresh sub-communicator, a device all_to_all with split
    sizes (``route``: "entry" or "python"; blocking or ``async_op``). A survivor returns (the
    PeerError's message, seconds from the call to the error, how the call went: "entry"/"python",
    whether the calls before were right); None on the victim. A blocking call's error is what
    ``async_error()`` then answers (the exception the next call would raise: a blocking device call
    returns once enqueued), an async one's what ``synchronize()`` raises."""
    sub = comm.split(0, timeout=30)
    ins, outs, x_host, want = _a2av_arrays(sub)
    x = emu.from_numpy(x_host)
    y = emu.from_numpy(np.full(sum(outs), -1, np.int64))

    def call():
        w = sub.all_to_all(y, x, output_splits=outs, input_splits=ins, async_op=async_op)
        return w

    sub.all_reduce(emu.from_numpy(np.ones(4, np.float32)))  # #1: the engine's set-up (the route)
    with python_route_only() if route == "python" else _nothing():
        w = call()  # #2
        if w is not None:
            w.synchronize()
        right = bool(np.array_equal(y.numpy(), want))
        hy = np.full(sum(outs), -1, np.int64)
        sub.all_to_all(hy, x_host, output_splits=outs, input_splits=ins)  # #3, on the host
        right &= bool(np.array_equal(hy, want))
        z = emu.from_numpy(np.ones(3, np.float32))
        sub.all_reduce(z)  # #4: numbered alike on every rank, or a MismatchError here
        right &= bool((z.numpy() == sub.size).all())
        # (the victim never makes the call: a rank's sends are enqueued at once, so a victim
        # inside the call could have delivered all its peers need before it dies)
        if arm_death(sub, victim):
            time.sleep(5)  # the kill arrives meanwhile
            return None
        entry_before = _C.device_all_to_allv_count()
        t = time.monotonic()
        with route_spy() as seen, _spy_on_all_to_allv(seen):
            try:
                w = call()
                if w is not None:
                    w.synchronize()
                else:
                    err = None
                    while err is None and time.monotonic() - t < 60:
                        err = sub.async_error()
                        time.sleep(0.01)
                    if err is not None:
                        raise err
                return "no error", time.monotonic() - t, None, right
            except commlib.PeerError as e:
                took = time.monotonic() - t
                # (the entry's count moves only once it enqueued: one that raised at the enqueue,
                # a peer failed earlier, is the entry's when no Python route ran)
                how = ("python" if seen == ["_all_to_allv", "p2p"] else
                       "entry" if not seen and _C.device_all_to_allv_count() - entry_before in (0, 1) else "?")
                return str(e), took, how, right
            except commlib.CommError as e:
                return f"wrong type {type(e).__name__}: {e}", time.monotonic() - t, None, right


@contextlib.contextmanager
def _spy_on_all_to_allv(seen):
    """Communicator._all_to_allv (the Python route's all_to_all with splits) appends its name to
    ``seen`` inside the block."""
    real = communicator.Communicator._all_to_allv

    def spy(self, *args, **kw):
        seen.append("_all_to_allv")
        return real(self, *args, **kw)
    communicator.Communicator._all_to_allv = spy
    try:
        yield
    finally:
        communicator.Communicator._all_to_allv = real


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
