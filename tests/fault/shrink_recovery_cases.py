"""Rank-side cases of test_shrink_recovery.py: init()'s own store under shrink and split (closing
any communicator leaves the others working), shrink's argument checks, and survivors retrying a
shrink during which one more rank dies, at each named step (commlib.bootstrap.phases).

The store cases build their own communicators with ``commlib.init(master_port=...)`` (rank 0
serves the store, as in a job without torchrun), each on its own port."""
from __future__ import annotations

import datetime
import os
import signal
import threading
import time

import numpy as np

import commlib
from commlib.bootstrap import phases
from commlib.errors import CommError, PeerError


def _init(comm, port, prefix, timeout=30):
    return commlib.init(rank=comm.rank, world_size=comm.size, master_addr="127.0.0.1", master_port=port,
                        prefix=prefix, timeout=timeout)


def _sum_of_ranks(c, me) -> int:
    x = np.array([me], np.int64)
    c.all_reduce(x)
    return int(x[0])


def _attempt(fn):
    try:
        return fn()
    except CommError as e:
        return f"{type(e).__name__}: {e}"


def case_documented_shrink_pattern(comm, port):
    """``smaller = comm.shrink(); comm.close(); comm = smaller``, then a split and a shrink of the
    smaller one (both rendezvous through the store), on every rank; rank 0 closes first."""
    me = comm.rank
    world = _init(comm, port, "pattern")
    smaller = world.shrink()
    world.close()  # rank 0: before the others may have finished building `smaller`
    out = [_attempt(lambda: _sum_of_ranks(smaller, me))]
    child = _attempt(lambda: smaller.split(0))
    out.append(child if isinstance(child, str) else _sum_of_ranks(child, me))
    again = _attempt(lambda: smaller.shrink())
    out.append(again if isinstance(again, str) else _sum_of_ranks(again, me))
    for c in (child, again, smaller):
        if not isinstance(c, str):
            c.close()
    return out


def case_split_outlives_parent(comm, port):
    """A split child, its parent closed, still splits and shrinks (through the parent's store)."""
    me = comm.rank
    world = _init(comm, port, "parent")
    child = world.split(0)
    world.close()
    grandchild = _attempt(lambda: child.split(0, key=-me))
    survivors = _attempt(lambda: child.shrink())
    out = [c if isinstance(c, str) else _sum_of_ranks(c, me) for c in (grandchild, survivors)]
    for c in (grandchild, survivors, child):
        if not isinstance(c, str):
            c.close()
    return out


def case_rank0_closes_during_peers_init(comm, port):
    """Rank 0 closes as soon as its init() returns, while rank 1 stalls at the step after mapping
    the region (it still has to read the store). Rank 1's init must complete; rank 0's close
    returns once nobody uses its server any more, and leaves no thread behind."""
    me = comm.rank
    threads = threading.active_count()
    if me == 1:
        phases.hook = lambda prefix, step: time.sleep(0.5) if (prefix, step) == ("early", "mapped") else None
    try:
        world = _attempt(lambda: _init(comm, port, "early"))
    finally:
        phases.hook = None
    if me == 0 and not isinstance(world, str):
        world.close()
    ok = world if isinstance(world, str) else "ok"
    if me != 0 and not isinstance(world, str):
        world.close()
    deadline = time.monotonic() + 10
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.02)  # bounded: rank 0's server thread ends once the last client left
    return ok, threading.active_count() - threads


def case_shrink_arguments(comm):
    """Ranks and timeouts are checked as every call checks them (np.int64 is a rank; text is not
    a timeout) and errors name the argument. Rank 2 leaves a split group (closes it); ranks 0 and 1
    shrink it excluding ``np.int64(2)``."""
    me = comm.rank
    group = comm.split(0)
    refused = {}
    for name, call in [("shrink_timeout_text", lambda: group.shrink(timeout="5")),
                       ("shrink_timeout_zero", lambda: group.shrink(timeout=0)),
                       ("shrink_exclude_float", lambda: group.shrink(exclude=[2.0])),
                       ("shrink_exclude_out_of_range", lambda: group.shrink(exclude=[np.int64(3)])),
                       ("shrink_exclude_not_a_list", lambda: group.shrink(exclude=2)),
                       ("split_timeout_text", lambda: group.split(0, timeout="5")),
                       ("init_timeout_text", lambda: commlib.init(rank=0, world_size=1, master_port=0, timeout="5")),
                       ("work_wait_timeout_text", lambda: group.barrier(async_op=True).wait(timeout="1"))]:
        try:
            call()
            refused[name] = "accepted"
        except (TypeError, ValueError) as e:
            refused[name] = f"{type(e).__name__}: {e}"
    if me == 2:
        group.close()
        return refused, None
    smaller = group.shrink(exclude=[np.int64(2)], timeout=np.float64(20))
    sizes = (smaller.size, _sum_of_ranks(smaller, me))
    smaller2 = smaller.shrink(timeout=datetime.timedelta(seconds=20))  # healthy: the same two ranks
    sizes += (smaller2.size,)
    for c in (smaller2, smaller, group):
        c.close()
    return refused, sizes


# -- survivors of a death during a shrink ------------------------------------------------------

# How long a held victim's connections outlive it: longer than a survivor across hosts once waited
# for its own links to confirm a death (2 s when its step failed, 2 s more to confirm the others'
# claims on its retry), so that it still saw the victim alive where its host mate did not.
HOLD_S = 6.0

def _die_at(step, hold=0.0):
    """Die at ``step`` of a shrink. With ``hold``, as a lost host does: the process is gone at once
    (its host mates see it), but its connections stay open ``hold`` seconds more (a child holds
    them), so ranks across hosts see the loss only then, long after any grace."""
    def hook(prefix, reached):
        if reached == step and "/shrink" in prefix:
            if hold and os.fork() == 0:
                time.sleep(hold)
                os._exit(0)
            os.kill(os.getpid(), signal.SIGKILL)
    return hook


def _members(c, me):
    out = np.zeros(c.size, np.int64)
    c.all_gather(out, np.array([me], np.int64))
    return [int(r) for r in out]


def _settle(dp, me):
    """The documented recovery: shrink, and call shrink again on PeerError, until a communicator
    whose members all answer. Returns what each try gave ("ok", or the error class)."""
    outcomes = []
    for _ in range(4):
        try:
            dp.shrink()
            outcomes.append("shrunk")
            members = _members(dp.comm, me)
            outcomes.append("ok")
            return outcomes, members
        except PeerError:
            outcomes.append("PeerError")
        except CommError as e:
            outcomes.append(f"{type(e).__name__}: {e}")
            return outcomes, None
    return outcomes, None


def case_deaths_at_each_step(comm, port, steps, held=(), timeout=30):
    """DataParallel over init()'s own store (rank 0 serves it; ``timeout`` is the communicators').
    For each step of ``steps`` the highest rank left dies at that step of a shrink (at the steps
    in ``held``, with its connections held open a while: _die_at); every survivor retries on
    PeerError as the docs say and trains a step on the result. Returns, per step, what each try
    gave and who is left, then the parameters."""
    import torch
    from commlib.parallel.data_parallel import DataParallel

    torch.manual_seed(0)
    me = comm.rank
    world = _init(comm, port, "deaths", timeout)
    dp = DataParallel(torch.nn.Linear(4, 2, dtype=torch.float64), world)
    opt = torch.optim.SGD(dp.parameters(), lr=0.125)
    log = []
    for k, step in enumerate(steps):
        if me == comm.size - 1 - k:
            phases.hook = _die_at(step, HOLD_S if step in held else 0.0)
        outcomes, members = _settle(dp, me)
        log.append((step, outcomes, members))
        if members is None:
            break
        x = torch.full((3, 4), float(me + k), dtype=torch.float64)
        opt.zero_grad()
        dp(x).sum().backward()
        opt.step()
    params = b"".join(p.detach().numpy().tobytes() for p in dp.parameters())
    dp.comm.close()
    return log, params


def case_dropped_device_communicator(comm):
    """A shrunk communicator that ran a device call, dropped without close() on every rank: its
    engine's exported memory (two memfds on the emulated device), events and threads are all given
    back. Returns (descriptors, events alive, threads) gained, after a bounded wait for the
    closing barrier that the dropped communicator runs on a thread of its own."""
    import gc

    import commlib.device.emulated as emu

    def counts():
        return len(os.listdir("/proc/self/fd")), emu.rule_counts()["events_alive"], threading.active_count()

    def device_call(c):
        y = emu.from_numpy(np.ones(8, np.float32))
        c.all_reduce(y)
        return float(y.numpy()[0])

    warm = comm.shrink()  # loads what stays loaded (the device, its threads) and closes properly
    device_call(warm)
    warm.close()
    gc.collect()
    before = counts()
    dropped = comm.shrink()
    total = device_call(dropped)
    del dropped
    gc.collect()  # once: the drop itself, not what the wait below sees, is what is tested
    deadline = time.monotonic() + 20
    while counts() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    return total, tuple(a - b for a, b in zip(counts(), before))
