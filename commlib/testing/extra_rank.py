"""One more rank process beside a ``RankPool``: a replacement that joins the pool's job
(``commlib.join``, docs/fault_tolerance.md "Growing back"). It starts as the pool's ranks do (the
preloaded forkserver, the pool's environment) with MASTER_ADDR/MASTER_PORT naming the pool's store,
runs one module-level function ``fn(*args)`` and sends back its result or traceback.
``JoinablePool`` is a pool that starts them and ends them with its ranks (the grow tests' one way)."""
from __future__ import annotations

import importlib
import os
import sys
import time
import traceback

from commlib.testing.ranks import RankFailure, RankPool, _prepare_rank_process, _start_context


def _run(module, path, name, args, conn, env, parent_env):
    _prepare_rank_process(env, parent_env)
    try:
        if path and os.path.dirname(path) not in sys.path:
            sys.path.insert(0, os.path.dirname(path))
        conn.send(("ok", getattr(importlib.import_module(module), name)(*args)))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class ExtraRank:
    """``fn(*args)`` in a new process that can reach ``pool``'s store (``commlib.join(prefix="pool")``
    finds it); ``result(timeout)`` waits for what it returned; ``kill()`` ends it."""

    def __init__(self, pool, fn, *args, env: dict | None = None):
        env = dict(env or {}, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(pool.store.port))
        ctx = _start_context(env)
        self.conn, child = ctx.Pipe()
        path = getattr(sys.modules.get(fn.__module__), "__file__", None)
        self.proc = ctx.Process(target=_run, args=(fn.__module__, path, fn.__name__, args, child, env,
                                                   dict(os.environ)), daemon=True)
        self.proc.start()
        self.pid = self.proc.pid

    def result(self, timeout: float, allow_death: bool = False):
        """What ``fn`` returned; RankFailure with its traceback if it raised, or if it died
        (None instead with ``allow_death``) or did not answer within ``timeout`` (it is killed)."""
        deadline = time.monotonic() + timeout
        while not self.conn.poll(0.05):  # True on a message, or once the process is gone
            if time.monotonic() > deadline:
                self.kill()
                raise RankFailure(f"extra rank did not answer within {timeout:.0f} s (hang?)")
        try:
            status, value = self.conn.recv()
        except EOFError:
            self.proc.join(10)
            if allow_death:
                return None
            raise RankFailure(f"extra rank died (exit code {self.proc.exitcode})") from None
        self.proc.join(10)
        if status != "ok":
            raise RankFailure(f"extra rank failed:\n{value}")
        return value

    def kill(self):
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)


class JoinablePool(RankPool):
    """A ``RankPool`` that also starts the replacement processes of its grow tests:
    ``pool.joiner(fn, *args, env=None)`` starts an ``ExtraRank`` beside it, and ``kill()`` (a hang
    detected by the pool, the end of a ``with`` block, a test's cleanup) ends the joiners with the
    ranks, so that no test has to track them::

        with JoinablePool(2, timeout=90) as pool:
            joiner = pool.joiner(cases.joiner_trains)
            results = pool.run(cases.members_grow, pool.store.port)
            joined = joiner.result(90)
    """

    def __init__(self, size: int, timeout: float = 120.0, env: dict | None = None):
        self.joiners = []
        super().__init__(size, timeout=timeout, env=env)

    def joiner(self, fn, *args, env: dict | None = None) -> ExtraRank:
        extra = ExtraRank(self, fn, *args, env=env)
        self.joiners.append(extra)
        return extra

    def kill(self):
        for extra in self.joiners:
            extra.kill()
        super().kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
