"""Killing a rank in the middle of a collective, and checking that every survivor said so.

The engine, the stream engine and the multi-host links all promise the same thing when a peer
dies: every other rank raises an error naming the dead rank and the call, within a bound, and
never a wrong type or a hang. These two helpers state that promise once for all their tests.
``mark_reached`` / ``wait_until_reached`` let a scenario's silent or late rank wait for the others
to reach a point (e.g. "gave up on me") instead of sleeping a fixed time. ``arm_death`` stages the
death itself.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable, List, Optional, Tuple

from commlib.errors import PeerError
from commlib.testing.ranks import RankPool


def run_killing_one_rank(size: int, victim: int, fn: Callable, env: Optional[dict] = None,
                         timeout: float = 90, args: tuple = ()) -> List:
    """Run ``fn(comm, victim, *args)`` on a fresh pool of ``size`` ranks, in which ``fn`` kills
    rank ``victim``; returns each rank's result (``None`` for the dead one). The pool is always
    killed afterwards: it is not reusable once a rank died."""
    pool = RankPool(size, timeout=timeout, env=env)
    try:
        return pool.run(fn, victim, *args, allow_death=True, timeout=timeout)
    finally:
        pool.kill()


def arm_death(comm, victim: int, kill_in_s: float = 0.3, late_s: float = 0.8) -> bool:
    """Stage ``victim``'s death inside the call the ranks make next: the victim arms its own
    SIGKILL, ``kill_in_s`` from now, and returns True (it goes on into the call, or sleeps, and
    dies there); the lowest other rank ("late") sleeps ``late_s`` first, so the victim is blocked
    waiting for its data and the others are inside the call when the kill comes; False on every
    rank but the victim."""
    if comm.rank == victim:
        threading.Timer(kill_in_s, os.kill, (os.getpid(), signal.SIGKILL)).start()
        return True
    if comm.rank == min(q for q in range(comm.size) if q != victim):
        time.sleep(late_s)
    return False


def survivor_outcome(call: Callable[[], object]) -> Optional[Tuple[str, float]]:
    """A survivor's side of a death, in the shape ``assert_survivors_named_the_dead_rank`` reads:
    ``None`` when ``call()`` returned, else ``(message, seconds the call took)``: the PeerError's
    message, or ``"wrong type <T>: ..."`` for any other exception (reported, not raised, so the
    assertion names the rank that got it)."""
    t = time.monotonic()
    try:
        call()
        return None
    except PeerError as e:
        return str(e), time.monotonic() - t
    except Exception as e:  # noqa: BLE001
        return f"wrong type {type(e).__name__}: {e}", time.monotonic() - t


def assert_survivors_named_the_dead_rank(results: List, victim: int, call: str = "all_reduce #",
                                         within_s: float = 30) -> None:
    """Every rank but ``victim`` returned ``(message, seconds)`` from its failed call: the message
    names ``rank <victim>`` and the call, is not a type confusion, and came within ``within_s``."""
    assert results[victim] is None, f"rank {victim} was to die, but returned {results[victim]!r}"
    for rank, res in enumerate(results):
        if rank == victim:
            continue
        assert res is not None, f"rank {rank} finished without error"
        msg, took = res
        assert "wrong type" not in msg, msg
        assert f"rank {victim}" in msg and call in msg, msg
        assert took < within_s, f"rank {rank} took {took:.1f} s"


def mark_reached(comm, tag: str) -> None:
    """Tell the other ranks of ``comm`` that this rank reached point ``tag`` (a key in the
    communicator's store, under its own prefix: unique to this communicator, so a pool that runs
    the scenario again never sees an old mark)."""
    comm._store.set(f"{comm._prefix}/testing/{tag}/{comm.rank}", b"1")


def wait_until_reached(comm, tag: str, ranks, limit_s: float = 60.0) -> None:
    """Wait until every rank in ``ranks`` called ``mark_reached(comm, tag)``: what a scenario's
    late rank waits for instead of a fixed sleep (a sleep long enough for a loaded machine is
    seconds wasted on an idle one, and too short on a busier one). TimeoutError after
    ``limit_s``."""
    from commlib.bootstrap.wait import wait_for_key
    deadline = time.monotonic() + limit_s
    for rank in ranks:
        wait_for_key(comm._store, f"{comm._prefix}/testing/{tag}/{rank}", deadline,
                     on_timeout=lambda: TimeoutError(f"rank {rank} did not reach {tag!r} within {limit_s} s"))
