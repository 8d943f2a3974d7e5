"""Rank-side scenarios of point-to-point calls on device buffers (commlib.emulated): send/recv,
batches, all_to_all with uneven splits, and a mismatched pair. Values encode (sender, receiver,
index), so a message read from the wrong slot, too early or from the wrong peer shows."""
from __future__ import annotations

import numpy as np

import commlib
import commlib.emulated as emu

# Element counts: empty, one, small, prime, and more than one 256 KiB chunk of int32 / float64.
COUNTS = [0, 1, 13, 97, 70001]
DTYPES = ["int32", "float64", "int64"]


def _message(src, dst, n, dtype, salt=0):
    return (np.arange(n, dtype=np.int64) * 7 + src * 1000 + dst * 100 + salt).astype(dtype)


def ring_shift(comm):
    """Every rank sends to the next and receives from the previous one, for every count (the
    dtype rotating), as sendrecv, as separate async send + recv on another stream, and with a
    collective in between that shares the pairs' chunk order. Returns the wrong cases."""
    P, r = comm.size, comm.rank
    nxt, prv = (r + 1) % P, (r - 1) % P
    bad = []
    s2 = emu.Stream()
    for k, n in enumerate(COUNTS):
        dt = DTYPES[k % len(DTYPES)]
        x = emu.from_numpy(_message(r, nxt, n, dt))
        y = emu.empty(n, dt)
        comm.sendrecv(x, nxt, y, prv)
        if not np.array_equal(y.numpy(), _message(prv, r, n, dt)):
            bad.append(f"sendrecv {n} x {dt}")
        x2 = emu.from_numpy(_message(r, nxt, n, dt, salt=5), stream=s2)
        y2 = emu.empty(n, dt, stream=s2)
        ws = [comm.send(x2, nxt, async_op=True, stream=s2), comm.recv(y2, prv, async_op=True, stream=s2)] \
            if r % 2 == 0 else [comm.recv(y2, prv, async_op=True, stream=s2), comm.send(x2, nxt, async_op=True, stream=s2)]
        z = emu.from_numpy(np.full(3, r, np.int64))
        comm.all_reduce(z)
        for w in ws:
            w.synchronize()
        if not np.array_equal(y2.host_view_unsynchronized(), _message(prv, r, n, dt, salt=5)):
            bad.append(f"async send/recv {n} x {dt}")
        if not (z.numpy() == sum(range(P))).all():
            bad.append(f"all_reduce between sends of {n} x {dt}")
    return bad


def fan_out_and_in(comm):
    """Rank 0 sends every other rank its own count (blocking sends, in rank order), then gathers
    one message from each through one batch. Returns the wrong cases."""
    P, r = comm.size, comm.rank
    bad = []
    counts = {q: COUNTS[q % len(COUNTS)] for q in range(P)}
    if r == 0:
        for q in range(1, P):
            comm.send(emu.from_numpy(_message(0, q, counts[q], "float32")), q)
        ys = {q: emu.empty(counts[q] + 1, "int64") for q in range(1, P)}
        comm.batch_p2p([("recv", ys[q], q) for q in range(P - 1, 0, -1)])
        for q in range(1, P):
            if not np.array_equal(ys[q].numpy(), _message(q, 0, counts[q] + 1, "int64")):
                bad.append(f"gather from {q}")
    else:
        y = emu.empty(counts[r], "float32")
        comm.recv(y, 0)
        if not np.array_equal(y.numpy(), _message(0, r, counts[r], "float32")):
            bad.append(f"rank {r} received wrong data")
        comm.send(emu.from_numpy(_message(r, 0, counts[r] + 1, "int64")), 0)
    return bad


def all_to_all_uneven(comm):
    """all_to_all with splits: rank i sends rank j ((i + 2j) % 4) * 9 elements (zeros included,
    uneven), async on another stream and blocking. Returns the wrong cases."""
    P, r = comm.size, comm.rank
    bad = []
    split = lambda i, j: ((i + 2 * j) % 4) * 9  # noqa: E731
    ins = [split(r, j) for j in range(P)]
    outs = [split(i, r) for i in range(P)]
    inp = np.concatenate([_message(r, j, ins[j], "int64") for j in range(P)])
    want = np.concatenate([_message(i, r, outs[i], "int64") for i in range(P)])
    for async_op in (False, True):
        s = emu.Stream() if async_op else None
        x = emu.from_numpy(inp, stream=s)
        y = emu.empty(sum(outs), "int64", stream=s)
        w = comm.all_to_all(y, x, output_splits=outs, input_splits=ins, async_op=async_op, stream=s)
        if async_op:
            w.synchronize()
            got = y.host_view_unsynchronized()
        else:
            got = y.numpy()
        if not np.array_equal(got, want):
            bad.append(f"all_to_all with splits (async={async_op})")
    return bad


def mismatched_pair(comm):
    """Rank 0 sends 10 elements, rank 1 receives 11: rank 1 raises MismatchError naming both
    messages; rank 0 learns of it at its next call. Runs on a split (it aborts)."""
    sub = comm.split(0, timeout=30)
    try:
        if sub.rank == 0:
            sub.send(emu.from_numpy(np.ones(10, np.float32)), 1)
            emu.synchronize()
            sub.all_reduce(emu.from_numpy(np.ones(4, np.float32)), async_op=True).synchronize()
        else:
            sub.recv(emu.empty(11, "float32"), 0, async_op=True).synchronize()
        return None
    except commlib.CommError as e:
        return type(e).__name__, str(e)
    finally:
        sub.close()


def mismatched_pair_already_there(comm, rounds):
    """The mismatched pair of ``mismatched_pair`` with the sent message (descriptor and data)
    already in rank 1's inbox when its receive starts (a barrier of ``comm`` between the send and
    the receive): rank 1's stream finds the mismatch and completes the receive at once, before its
    watchdog fails the engine, and the receive must raise all the same (run with no emulated delay,
    it returned without error about every second time when the recorded error carried no call
    number). ``rounds`` times on fresh splits; returns each round's (error type, message) or None."""
    got = []
    for _ in range(rounds):
        sub = comm.split(0, timeout=30)
        try:
            sub.all_reduce(emu.from_numpy(np.ones(4, np.float32)))  # the engines' set-up, a rendezvous
            if sub.rank == 0:
                sub.send(emu.from_numpy(np.ones(10, np.float32)), 1)
                emu.synchronize()
            comm.barrier()
            if sub.rank == 0:
                sub.all_reduce(emu.from_numpy(np.ones(4, np.float32)), async_op=True).synchronize()
            else:
                sub.recv(emu.empty(11, "float32"), 0, async_op=True).synchronize()
            got.append(None)
        except commlib.CommError as e:
            got.append((type(e).__name__, str(e)))
        finally:
            sub.close()
    return got


def host_against_device(comm, receiver_on_device, first_device_call=False):
    """Rank 0 sends 10 float32 to rank 1, one side from or into a host array and the other a device
    buffer (``receiver_on_device``: rank 0 sends a host array, rank 1 receives into a device
    buffer; else the other way round). Host and device messages of a pair share one numbering, so
    this is message #1 on both sides in different kinds: rank 1's receive raises MismatchError
    naming both messages, and rank 0 (whose send completed: it fits the channel) raises it at its
    next call. Other ranks do nothing after a first device all_reduce (``first_device_call``: none,
    so rank 1's receive is its first device call, waiting for the peers' engines; only with
    ``receiver_on_device``). Runs on a split (it aborts). Returns (error type, message,
    seconds) on ranks 0 and 1."""
    import time
    sub = comm.split(0, timeout=30)
    host = np.ones(10, np.float32)
    dev = emu.from_numpy(np.ones(10, np.float32))
    if not first_device_call:
        sub.all_reduce(dev)  # the engines exist (their set-up is a rendezvous of every rank)
    dev.numpy()
    t = time.monotonic()
    try:
        if sub.rank == 0:
            if receiver_on_device:
                sub.send(host, 1)
            else:
                sub.send(dev, 1)
                emu.synchronize()
            sub.all_reduce(np.ones(4, np.float32))
        elif sub.rank == 1:
            if receiver_on_device:
                sub.recv(emu.empty(10, "float32"), 0, async_op=True).synchronize()
            else:
                sub.recv(np.empty(10, np.float32), 0)
        return None
    except commlib.CommError as e:
        return type(e).__name__, str(e), time.monotonic() - t
    finally:
        sub.close()
