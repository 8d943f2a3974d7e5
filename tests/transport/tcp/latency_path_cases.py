"""Rank-side checks for the TCP small-message path: a waiting caller reads its sockets itself,
keeps them between calls, hands them back when it stops polling, and a small frame costs one
recv (the lane's staging buffer). Values are integers, checked for exact equality."""
from __future__ import annotations

import time

import numpy as np


# A spin long enough to cover a round trip on a loaded machine (1 s): the caller reads every
# answer, and a caller that waited holds its sockets afterwards.
LONG_SPIN_S = 1.0
LONG_SPIN = {"COMMLIB_TCP_SPIN_US": str(int(LONG_SPIN_S * 1e6))}


def stats(comm):
    return comm._core.tcp_stats()


def wait_for(comm, since, key, limit_s):
    """Sleeps (no commlib call) until tcp_stats' ``key`` has grown past ``since`` (a stats dict),
    or ``limit_s`` passed; returns whether it grew."""
    end = time.monotonic() + limit_s
    while stats(comm)[key] <= since[key]:
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


def sockets_to_the_progress_thread(comm):
    """Makes sure the progress thread reads this rank's sockets, whatever ran on the pool before:
    a caller that held them since an earlier call (the last wait's spin got its answer) loses them
    once it stops polling for 2 ms. (A caller that did not hold them sees no take-back: the wait
    ends after 1 s.)"""
    comm.barrier()
    wait_for(comm, stats(comm), "reclaims", 1.0)


def round_trips(comm, n):
    """n 8-byte all_reduces, starting with the sockets with the progress thread; returns (all
    right, deltas of every tcp_stats counter). Shared by the small-message path's and the
    zero-copy path's tests."""
    sockets_to_the_progress_thread(comm)
    before = stats(comm)
    x = np.zeros(2, np.int64)
    ok = True
    for i in range(n):
        x[:] = comm.rank + i
        comm.all_reduce(x)
        ok &= bool((x == sum(q + i for q in range(comm.size))).all())
    after = stats(comm)
    return ok, {k: after[k] - before[k] for k in after}


def rank_1_takes_its_sockets(comm):
    """Rank 1's caller takes its sockets from the progress thread (they must be there: see
    sockets_to_the_progress_thread) in a receive that rank 0 answers late, and keeps them: its
    spin (LONG_SPIN) got the answer, which it knows when the receive took less than a spin. It
    tells rank 0 whether so; where rank 1 came too late to wait, or its spin ran out on a busy
    machine, they try again."""
    flag = np.zeros(1, np.int64)
    for _ in range(20):
        if comm.rank == 0:
            time.sleep(0.05)
            comm.send(flag, 1)
            comm.recv(flag, 1)
        else:
            before, t = stats(comm), time.monotonic()
            comm.recv(flag, 0)
            took = stats(comm)["caller_takes"] > before["caller_takes"]
            flag[0] = took and time.monotonic() - t < LONG_SPIN_S
            comm.send(flag, 0)
        if flag[0]:
            return


def busy_receiver(comm, idle_s):
    """Rank 1's caller takes its sockets in a receive; rank 0 then sends it 8 bytes while rank 1
    does something else (not a commlib call) for at least `idle_s` and until its progress thread
    took the sockets back and read what came (however slow the machine: not a fixed time), then
    receives. Returns (received right, counter deltas from the send to after the receive, but
    caller_takes and reclaims from before the take: the take-back may come at once, 2 ms after
    the caller's last poll, before the send)."""
    sockets_to_the_progress_thread(comm)
    start = stats(comm)
    rank_1_takes_its_sockets(comm)
    before = stats(comm)
    ok = True
    if comm.rank == 0:
        comm.send(np.array([7, 11], np.int64), 1)
    else:
        time.sleep(idle_s)
        wait_for(comm, start, "reclaims", 30)
        wait_for(comm, before, "recv_reads", 30)
        y = np.zeros(2, np.int64)
        comm.recv(y, 0)
        ok = y.tolist() == [7, 11]
    after = stats(comm)
    comm.barrier()
    deltas = {k: after[k] - before[k] for k in after}
    deltas.update({k: after[k] - start[k] for k in ("caller_takes", "reclaims")})
    return ok, deltas


def mixed_sizes_queued(comm, sizes, idle_s):
    """Rank 0 sends messages of `sizes` int32 elements back to back while rank 1 is busy for
    `idle_s`, so its sockets hold many frames at once (several per staged read, frames cut
    across reads, the receive ring full with read-ahead bytes waiting); then rank 1 receives them
    in order. Returns the sizes whose message arrived wrong (rank 1)."""
    bad = []
    if comm.rank == 0:
        for k, n in enumerate(sizes):
            comm.send(np.arange(k, k + n, dtype=np.int32), 1)
    else:
        time.sleep(idle_s)
        for k, n in enumerate(sizes):
            y = np.full(n, -1, np.int32)
            comm.recv(y, 0)
            if not np.array_equal(y, np.arange(k, k + n, dtype=np.int32)):
                bad.append(n)
    comm.barrier()
    return bad


def slow_senders(comm, gap_s, round_trips_after):
    """Rank 0 receives from every other rank in one call (one batch, one step) while rank r sends
    only after r * ``gap_s``: the call waits on peers far slower than a spin several times over.
    Then ``round_trips_after`` 8-byte all_reduces. Returns rank 0's (received right, its caller's
    spins that ran out during the slow call, the times its caller took its sockets to spin during
    the all_reduces: every spin starts with one, the slow call having handed them back)."""
    comm.barrier()
    before = stats(comm)
    bufs = [np.zeros(4, np.int64) for _ in range(comm.size - 1)]
    if comm.rank:
        time.sleep(comm.rank * gap_s)
        comm.send(np.full(4, comm.rank, np.int64), 0)
    else:
        comm.batch_p2p([("recv", b, r + 1) for r, b in enumerate(bufs)])
    mid = stats(comm)
    x = np.ones(1, np.int64)
    for _ in range(round_trips_after):
        comm.all_reduce(x, op="max")
    after = stats(comm)
    comm.barrier()
    ok = comm.rank or all((b == r + 1).all() for r, b in enumerate(bufs))
    return ok, mid["spins_out"] - before["spins_out"], after["caller_takes"] - mid["caller_takes"]
