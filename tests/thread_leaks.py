"""Which threads a test left running: tests/conftest.py's autouse ``_no_leaked_threads`` fails a
test that leaves a non-daemon thread, or a commlib-named one (a ``commlib-store`` server, a
``commlib-torch-*`` completion thread, ...), alive after it ends.

Why: a store server thread left by one test lives on in the worker and meets the next tests' patches
(session 23's CI B: a fake clock patched in test_wait_until reached a store thread an earlier test
had started, which died of the fake clock's StopIteration). The rank pools' store threads
(commlib.testing's session-cached pools) serve the whole session by design, and what a module- or
session-scoped fixture started before the test is not the test's: only threads started during the
test count (a module-scoped check covers the module's fixtures). A pool's store thread that died
during the test fails it too: that store was what CI B's fake clock met.

Cheap: two ``threading.enumerate()`` per test; a thread that is ending anyway (a store closed at
the test's end is joined already) gets a short join before it counts as left.
"""
from __future__ import annotations

import threading
import time
from typing import Iterable, List

# How long the threads a test started may take to end after it (a dropped communicator's
# commlib-dropped-close thread waits for its garbage collection's barrier, bounded); generous, as
# CI's 2 cores are loaded and the join returns as soon as a thread ends.
GRACE_S = 5.0


def pool_threads() -> set:
    """The store threads of commlib.testing's cached rank pools: they serve the whole session."""
    from commlib.testing import ranks
    return {p.store._thread for p in list(ranks._POOLS.values()) if p.store is not None}


def retire_pools_with_dead_stores() -> List[str]:
    """The cached rank pools whose store thread died while the pool lives on (CI B's failure: a test
    patched the time module, which the store's loop shares), killed so that the next test gets a
    fresh pool: named at the test that killed the store rather than at later tests whose ranks
    lost it."""
    from commlib.testing import ranks
    dead = [(size, p) for (size, *_), p in list(ranks._POOLS.items())
            if p.store is not None and not p.store._closing and not p.store._thread.is_alive()]
    for _, p in dead:
        p.kill()
    return [f"the {size}-rank pool's" for size, _ in dead]


def counts(thread: threading.Thread) -> bool:
    """A thread a test must not leave: not a daemon (the interpreter's exit waits for it), or ours."""
    return not thread.daemon or thread.name.startswith("commlib")


def left_running(before: Iterable[threading.Thread], grace_s: float = GRACE_S) -> List[threading.Thread]:
    """The threads started since ``before`` was listed that still run after up to ``grace_s`` s of
    joining, excluding the rank pools' store threads."""
    known = set(before) | pool_threads()
    new = [t for t in threading.enumerate() if t not in known and counts(t)]
    deadline = time.monotonic() + grace_s
    for t in new:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t for t in new if t.is_alive()]


def describe(threads: Iterable[threading.Thread]) -> str:
    return ", ".join(f"{t.name!r} ({'daemon' if t.daemon else 'not a daemon'})" for t in threads)
