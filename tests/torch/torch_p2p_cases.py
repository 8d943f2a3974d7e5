"""Rank side of test_cuda_p2p_emulated.py: the torch backend's point-to-point on device arrays, driven with
``commlib.emulated`` arrays through the process group's own methods (torch's ``dist.send`` takes
torch tensors only, and torch's CPU build has no CUDA tensor). Each case runs on a fresh group over
a split of the pool's communicator and returns its failures (empty: all good).

Values encode (sender, receiver, index, salt), so a message read from the wrong slot, too early
(the emulated delay is on) or from the wrong peer shows; comparisons are exact.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

import commlib.emulated as emu
from commlib.torch.backend import ProcessGroupCommlib

COUNTS = [0, 1, 13, 70001]  # empty, one, small, more than one engine chunk
DTYPES = ["int32", "float64", "int64", "float32"]


def _message(src, dst, n, dtype, salt=0):
    return (np.arange(n, dtype=np.int64) * 7 + src * 1000 + dst * 100 + salt).astype(dtype)


def _group(comm):
    return ProcessGroupCommlib(comm.split(0), comm.rank, comm.size)


def _threads():
    return len(os.listdir("/proc/self/task"))  # native ones too: an emulated stream is a thread


def ring_receive_first(comm):
    """Every rank posts its receive from the previous rank before its send to the next (which
    deadlocks unless the operations are held back and batched), for every count, and waits; the
    current stream then sees the data (``numpy()`` waits for the current stream only). After
    shutdown the group's threads (its engine's, its point-to-point stream's) are gone."""
    P, r = comm.size, comm.rank
    nxt, prv = (r + 1) % P, (r - 1) % P
    emu.default_stream()  # the process's own, kept
    # The emulated device's process-wide threads (its host-function thread and hardware queues, as
    # CUDA's own) start on first use and stay: one small ring on a group shut down first starts them.
    warm = _group(comm)
    wr, ws = warm.recv([emu.empty(1, "int32")], prv), warm.send([emu.from_numpy(_message(r, nxt, 1, "int32"))], nxt)
    wr.wait()
    ws.wait()
    warm.shutdown()
    time.sleep(0.2)
    threads = _threads()
    pg, bad = _group(comm), []
    for k, n in enumerate(COUNTS):
        dt = DTYPES[k % len(DTYPES)]
        y = emu.empty(n, dt)
        wr = pg.recv([y], prv)
        ws = pg.send([emu.from_numpy(_message(r, nxt, n, dt))], nxt)
        if k % 2:
            wr.wait()
            ws.wait()
        else:  # the future's value is the tensors, once the current stream waits for them
            got = wr.get_future().wait()
            if got[0] is not y or ws.get_future().wait()[0] is None:
                bad.append(f"future values of {n} x {dt}")
        if not np.array_equal(y.numpy(), _message(prv, r, n, dt)):
            bad.append(f"ring {n} x {dt}")
    pg.shutdown()
    deadline = time.monotonic() + 5
    while _threads() > threads and time.monotonic() < deadline:
        time.sleep(0.01)
    if _threads() > threads:
        bad.append(f"{_threads() - threads} thread(s) left after shutdown")
    return bad


def side_stream_producer(comm):
    """A send of an array written on another stream is ordered after that write (the event
    recorded at the call), and the receiver's wait() orders its own side stream. The write is
    queued behind 300 delayed copies, so the send would otherwise read the array's old zeros."""
    P, r = comm.size, comm.rank
    nxt, prv = (r + 1) % P, (r - 1) % P
    pg, bad = _group(comm), []
    n = 70001
    x = emu.from_numpy(np.zeros(n, np.float32))
    emu.synchronize()
    s = emu.Stream()
    with emu.use_stream(s):
        real = emu.from_numpy(_message(r, nxt, n, "float32", salt=3))
        a, b = emu.empty(1, "int8"), emu.empty(1, "int8")
        for _ in range(300):  # ~6 ms of stream work at the 20 us delay
            a.copy_(b)
        x.copy_(real)
        ws = pg.send([x], nxt)
        y = emu.empty(n, "float32")
        wr = pg.recv([y], prv)
        wr.wait()  # s waits for the batch
        ws.wait()
        got = y.numpy()  # waits for s only
    if not np.array_equal(got, _message(prv, r, n, "float32", salt=3)):
        bad.append("side stream: the message or its wait was not ordered on that stream")
    pg.shutdown()
    return bad


def several_per_pair_and_mixed(comm):
    """Three messages to the next rank and three from the previous (batches 1..3, in call order),
    interleaved with a host tensor each way; the receives are posted in a different order than
    the sends but, per pair and per kind (host, device), in the same order."""
    P, r = comm.size, comm.rank
    nxt, prv = (r + 1) % P, (r - 1) % P
    pg, bad = _group(comm), []
    sizes = [5, 97, 1]
    ys = [emu.empty(n, "int64") for n in sizes]
    host_in = torch.zeros(4, dtype=torch.int16)  # a dtype the core moves as bytes
    works = [pg.recv([ys[0]], prv), pg.recv([host_in], prv)]
    works += [pg.send([emu.from_numpy(_message(r, nxt, n, "int64", salt=i))], nxt) for i, n in enumerate(sizes)]
    works.append(pg.send([torch.arange(4, dtype=torch.int16) + 10 * r], nxt))
    works += [pg.recv([ys[1]], prv), pg.recv([ys[2]], prv)]
    for w in works:
        w.wait()
    for i, n in enumerate(sizes):
        if not np.array_equal(ys[i].numpy(), _message(prv, r, n, "int64", salt=i)):
            bad.append(f"device message {i} ({n} x int64) from rank {prv}")
    if not torch.equal(host_in, torch.arange(4, dtype=torch.int16) + 10 * prv):
        bad.append(f"host message from rank {prv}: {host_in.tolist()}")
    # A collective issues the held-back operations too (and is ordered after them).
    y = emu.empty(3, "float64")
    w = pg.recv([y], prv)
    pg.send([emu.from_numpy(_message(r, nxt, 3, "float64", salt=9))], nxt)
    pg.barrier()
    if not w.is_completed():
        w.synchronize()
    if not np.array_equal(y.numpy(), _message(prv, r, 3, "float64", salt=9)):
        bad.append("receive issued by a later barrier")
    pg.shutdown()
    return bad


def refusals(comm):
    """Bad arguments are refused at the call, naming the argument, before anything moves."""
    pg, bad = _group(comm), []
    a = emu.empty(4, "float32")
    cases = {
        "src: receiving a device tensor from any source": lambda: pg.recv_anysource([a]),
        "tensors: a send takes one tensor": lambda: pg.send([a, a], (comm.rank + 1) % comm.size),
        "dst: invalid peer": lambda: pg.send([a], comm.rank),
    }
    for want, fn in cases.items():
        try:
            fn()
            bad.append(f"not refused: {want}")
        except ValueError as e:
            if not str(e).startswith(want):
                bad.append(f"{want!r} expected, got {e}")
    if pg._p2p:
        bad.append("a refused call left an operation held back")
    pg.shutdown()
    return bad


def mismatched_sizes(comm):
    """Rank 1 receives 11 float32 where rank 0 sends 10 (bytes on the wire: 44 against 40):
    rank 1's work raises MismatchError naming both; rank 0 learns of it at its next device call.
    Returns (error kind, message) per rank."""
    pg = _group(comm)
    try:
        if comm.rank == 0:
            pg.send([emu.from_numpy(np.ones(10, np.float32))], 1).synchronize()
            pg.comm.all_reduce(emu.from_numpy(np.ones(4, np.float32)), async_op=True).synchronize()
        else:
            pg.recv([emu.empty(11, "float32")], 0).synchronize()
        out = ("no error", "")
    except Exception as e:  # noqa: BLE001 - reported to the test
        out = (type(e).__name__, str(e))
    pg.abort()
    return out


def unreported_at_shutdown(comm):
    """Rank 1 receives 11 float32 where rank 0 sends 10, and nobody waits for either work: the
    receive writes nothing into its buffer, and rank 1's shutdown() raises the MismatchError and
    logs it (torch's watchdog style: commlib/torch/at_exit.py). Returns per rank (the buffer
    unchanged, the error shutdown() raised, the lines logged)."""
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("commlib.torch")
    logger.addHandler(handler)
    pg = _group(comm)
    try:
        if comm.rank == 0:
            x = emu.from_numpy(np.ones(10, np.float32))
            pg.send([x], 1)
            pg._flush_p2p()
        else:
            x = emu.from_numpy(np.full(11, 7, np.float32))
            pg.recv([x], 0)
            pg._flush_p2p()
        unchanged = comm.rank == 0 or bool((x.numpy() == 7).all())
        try:
            pg.shutdown()
            error = None
        except Exception as e:  # noqa: BLE001 - reported to the test
            error = type(e).__name__
    finally:
        logger.removeHandler(handler)
        from commlib.torch import at_exit
        at_exit._unreported.clear()  # the pool's rank process goes on: not a failed exit
    return unchanged, error, records
