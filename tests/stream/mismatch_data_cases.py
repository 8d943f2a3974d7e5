"""Rank side of test_mismatch_data.py (apart from the test module, so that the ranks import neither
pytest nor the test modules): device calls whose ranks disagree on the dtype or the count, on the
kernel path and on the copy path. A mismatched call must leave every output as it was (never a
peer's bytes in it), and its MismatchError must reach the caller: at the work's wait() for an
asynchronous call, at close() for a blocking call that no later call surfaced."""
import numpy as np

import commlib
import commlib.emulated as emu
from commlib.settings import overridden
from kernel_path_cases import COPY_SETTINGS, KERNEL_SETTINGS

# copy: the copy path's data operations as by default, gated on a device mirror of the stop word
# (COMMLIB_DEVICE_COPY_RECV unset: mirror); copy+gated: on the stop word itself, read by every block
# (COMMLIB_DEVICE_COPY_RECV=gated, a diagnostic: docs/gpu.md "The copy path's large-message regression").
PATHS = {"kernel": KERNEL_SETTINGS, "copy": COPY_SETTINGS,
         "copy+gated": dict(COPY_SETTINGS, COMMLIB_DEVICE_COPY_RECV="gated")}
N = 256  # elements: several of the test settings' 4 KiB chunks on the copy path


def _full(n, dtype, value):
    x = emu.from_numpy(np.full(n, value, dtype))
    return x


def _odd(rank, kind, changed=0):
    """Whether ``rank`` is the one that calls differently."""
    return rank == changed


def _dtype(rank, kind, changed=0):
    return "int32" if kind == "dtype" and _odd(rank, kind, changed) else "float32"


def _count(rank, kind, changed=0):
    return 3 * N if kind == "count" and _odd(rank, kind, changed) else N


def _scenario(sub, coll, kind, changed):
    """(the call to make, given async_op; the buffers it may write, each with its content before)."""
    r, P = sub.rank, sub.size
    dt, n = _dtype(r, kind, changed), _count(r, kind, changed)
    # A rank's own bytes: 2.0, 3.0, ... as float32; the int32 of the changed rank reads as about
    # 1.0 in float32 (and 2.0 reads as a large int32), so a peer's bytes reduced in show.
    value = 2 + r if dt == "float32" else 0x3F800000 + r
    if coll == "all_reduce":
        x = _full(n, dt, value)
        return (lambda a: sub.all_reduce(x, algorithm=ALGO[P], async_op=a)), [x]
    if coll == "avg":  # the divide after the launch is gated too (CopyPath::gate_after_call)
        x = _full(n, dt, value)
        return (lambda a: sub.all_reduce(x, op="avg", algorithm=ALGO[P], async_op=a)), [x]
    if coll in ("mapped", "mapped_avg"):  # one-sided on buffers every rank maps (the route agreed: stream_one_sided.cc)
        x = _full(n, dt, value)
        op = "avg" if coll == "mapped_avg" else "sum"
        return (lambda a: sub.all_reduce(x, op=op, algorithm="mapped_fused_two_shot", async_op=a)), [x]
    if coll == "all_gather":
        x, out = _full(n, dt, value), _full(n * P, dt, -1)
        return (lambda a: sub.all_gather(out, x, async_op=a)), [out]
    if coll == "reduce_scatter":
        x, out = _full(n * P, dt, value), _full(n, dt, -1)
        return (lambda a: sub.reduce_scatter(out, x, async_op=a)), [out]
    if coll == "broadcast":
        x = _full(n, dt, value)
        return (lambda a: sub.broadcast(x, root=1, async_op=a)), [x]
    if coll == "p2p":  # rank 1 sends, rank 0 receives (the changed rank is the receiver)
        if r == 1:
            x = _full(N, "float32", value)
            return (lambda a: sub.send(x, 0, async_op=a)), []
        x = _full(n, dt, -1)
        return (lambda a: sub.recv(x, 1, async_op=a)), [x]
    raise ValueError(coll)


ALGO = {2: "ring", 4: "ring"}


def comm_error(fn):
    """What ``fn()`` raised, if a CommError, as "Type: message"; None when it returned."""
    try:
        fn()
    except commlib.CommError as e:
        return f"{type(e).__name__}: {e}"
    return None


def mismatched_calls(comm, path, cases, changed=0):
    """Each case (collective, "dtype" or "count", "blocking" or "async") on its own
    sub-communicator with ``path``'s settings, after a matched warm-up call: rank ``changed`` calls
    with another dtype or count. Per case: (the outputs unchanged, the error of the call itself or
    of its wait() (async), the error at close())."""
    out = []
    for coll, kind, mode in cases:
        with overridden(PATHS[path]):  # the engine is made at the first device call
            sub = comm.split(0, timeout=60)
            warm = _full(8, "float32", 1)
            sub.all_reduce(warm)
            warm.numpy()
            assert sub._device_route.last_path() == path.split("+")[0], sub._device_route.last_path()
        call, bufs = _scenario(sub, coll, kind, changed)
        before = [b.numpy().copy() for b in bufs]
        # A rank may learn of the mismatch before its own call is enqueued (a peer's watchdog failed
        # first and published it): the call itself raises, which is as good as wait() raising.
        works = []
        at_wait = comm_error(lambda: works.append(call(mode == "async")))
        after = [b.numpy() for b in bufs]  # synchronizes the buffers' stream
        if works and works[0] is not None:
            at_wait = comm_error(works[0].wait)
        unchanged = all(np.array_equal(a, b) for a, b in zip(before, after))
        out.append((unchanged, at_wait, comm_error(sub.close)))
    return out
