"""The one place tests and bench scripts start rank processes (``commlib.testing``).

A ``RankPool(n)`` starts ``n`` long-lived worker processes once, each with a commlib communicator
(rendezvous through a store served by the pytest process). ``pool.run(fn, *args)`` sends a
module-level function to every rank, runs ``fn(comm, *args)`` there, and returns the list of
per-rank results (rank order). A failure on any rank raises ``RankFailure`` carrying every failed
rank's traceback. Each call has a timeout: a hang kills the pool and fails the test instead of
eating the CI budget. Whole test matrices run inside one pool per world size; spawning per case
is what this module exists to avoid.

Pools are cached per (world size, env) for the pytest session by ``get_pool``; a pool whose
processes died or timed out is replaced on the next request.
"""
from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import sys
import time
import traceback

from commlib.bootstrap.store import StoreServer

# The directory holding the commlib package: rank processes import this same commlib.
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Rank processes fork from one forkserver that imported these once: a spawned rank importing torch
# costs seconds of CPU (tens of seconds when 4 ranks start on 2 busy cores), a fork a millisecond.
# Importing them starts no thread (checked: numpy's BLAS pool obeys OMP_NUM_THREADS=1, set for the
# server) and no CUDA context (torch initialises CUDA lazily). A missing module is skipped.
# torch._dynamo: every torch optimizer's constructor imports it on first use (its
# disable-dynamo wrapper), ~10 s of CPU per rank on a busy machine; its import starts no thread.
FORKSERVER_PRELOAD = ("numpy", "torch", "torch.distributed", "torch._dynamo")
# A rank environment naming any of these would be read at import time, which the forkserver has
# already done: such pools are spawned instead.
IMPORT_TIME_ENV_PREFIXES = ("OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH_", "CUDA_", "PYTORCH_", "NCCL_")
_forkserver_ready = False


def _start_context(env: dict):
    """The multiprocessing context for a pool with extra environment ``env``: the preloaded
    forkserver, or spawn where ``env`` changes what an import reads."""
    global _forkserver_ready
    if any(k.startswith(IMPORT_TIME_ENV_PREFIXES) for k in env):
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    if not _forkserver_ready:
        from multiprocessing import forkserver
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
        saved = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = saved or "1"  # the server's environment, read by its imports
        try:
            forkserver.ensure_running()
        finally:
            if saved is None:
                del os.environ["OMP_NUM_THREADS"]
        _forkserver_ready = True
    return ctx


class RankFailure(AssertionError):
    """One or more ranks raised; the message holds each failing rank's traceback."""


def process_context(env: dict | None = None):
    """A multiprocessing context for a test's own rank processes (outside a pool): the forkserver
    with torch already imported, so that starting a rank costs a fork, not a torch import."""
    return _start_context(env or {})


def _prepare_rank_process(env, parent_env=None):
    """``parent_env``: the pool creator's whole environment when the pool was made, which a
    forkserver child does not inherit (it has the server's, from its start), so that a rank sees
    what a spawned one would."""
    import faulthandler
    faulthandler.enable()
    if parent_env is not None:
        os.environ.clear()
        os.environ.update(parent_env)
    # One compute thread per rank: several ranks share 2 cores, and torch's default thread pool
    # per rank makes them fight (100x slower small matmuls). Set before anything imports torch.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.update(env)
    # Spawned children start with the parent's sys.path (so a test's helper modules import); the
    # package's own directory goes first so ranks never pick up another installed commlib.
    sys.path.insert(0, PACKAGE_PARENT)


def _worker(rank, size, port, conn, env, parent_env):
    # A tuple value gives each rank its own setting (e.g. COMMLIB_HOST_ID for emulated hosts).
    _prepare_rank_process({k: v[rank] if isinstance(v, tuple) else v for k, v in env.items()}, parent_env)
    try:
        import commlib
        from commlib.bootstrap.store import TCPStore
        comm = commlib.init(rank=rank, world_size=size, store=TCPStore("127.0.0.1", port), prefix="pool")
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    serve_calls(comm, conn)


def serve_calls(comm, conn):
    """A rank's side of the pool: say ready, then run each function the pool sends on ``comm``
    and send back its result or traceback, until the pool says stop; then close ``comm``."""
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        module, path, name, args, kwargs = msg
        try:
            if path and os.path.dirname(path) not in sys.path:
                sys.path.insert(0, os.path.dirname(path))
            fn = getattr(importlib.import_module(module), name)
            conn.send(("ok", fn(comm, *args, **kwargs)))
        except BaseException as exc:  # report everything, keep serving
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    try:
        comm.close()
    except Exception:
        pass


class RankPool:
    """``size`` rank processes sharing one communicator; see the module docstring."""

    def __init__(self, size: int, timeout: float = 120.0, env: dict | None = None):
        self.size = size
        self.timeout = timeout
        self.env = dict(env or {})
        self.store = None
        self.conns, self.procs = [], []
        self.broken = False
        try:
            self._start_ranks()
            self._collect("start-up", timeout)
        except BaseException:
            self.kill()
            raise

    def _start_ranks(self):
        """Starts the rank processes and fills ``conns`` and ``procs`` (``is_alive()``,
        ``exitcode``, ``kill()``, ``join(t)``) in rank order; subclasses start them elsewhere."""
        self.store = StoreServer("127.0.0.1", 0)
        ctx = _start_context(self.env)
        for r in range(self.size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(r, self.size, self.store.port, child, self.env, dict(os.environ)),
                            daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def _collect(self, what, timeout, allow_death=False):
        deadline = time.monotonic() + timeout
        results, errors = [None] * self.size, []
        waiting = set(range(self.size))
        while waiting:
            for r in sorted(waiting):
                c = self.conns[r]
                if not c.poll(0):
                    if not self.procs[r].is_alive():
                        if allow_death:
                            self.broken = True
                            waiting.discard(r)
                            continue
                        self.kill()
                        raise RankFailure(f"{what}: rank {r} died (exit code {self.procs[r].exitcode})"
                                          + ("\n" + "\n".join(errors) if errors else ""))
                    continue
                try:
                    status, value = c.recv()
                except EOFError:
                    if allow_death:
                        self.broken = True
                        waiting.discard(r)
                        continue
                    self.kill()
                    raise RankFailure(f"{what}: rank {r} closed its pipe")
                waiting.discard(r)
                if status in ("ok", "ready"):
                    results[r] = value
                else:
                    errors.append(f"--- rank {r} ---\n{value}")
            if not waiting:
                break
            if time.monotonic() > deadline:
                self.kill()
                raise RankFailure(f"{what}: rank(s) {sorted(waiting)} did not answer within {timeout:.0f} s "
                                  "(hang?)" + ("\n" + "\n".join(errors) if errors else ""))
            from multiprocessing.connection import wait as _wait
            _wait([self.conns[r] for r in waiting], timeout=0.05)
        if errors:
            raise RankFailure(f"{what} failed on {len(errors)} rank(s):\n" + "\n".join(sorted(errors)))
        return results

    def run(self, fn, *args, timeout: float | None = None, allow_death: bool = False, **kwargs):
        """Run ``fn(comm, *args, **kwargs)`` on every rank; return the per-rank results.

        With ``allow_death`` a rank that dies yields None instead of failing the call (the pool is
        then retired).
        """
        if self.broken:
            raise RankFailure("pool is broken by an earlier hang")
        path = getattr(sys.modules.get(fn.__module__), "__file__", None)
        for c in self.conns:
            c.send((fn.__module__, path, fn.__name__, args, kwargs))
        try:
            return self._collect(fn.__name__, timeout or self.timeout, allow_death)
        except RankFailure as e:
            if "did not answer" in str(e) or "died" in str(e) or "closed" in str(e):
                self.broken = True
            raise

    def alive(self) -> bool:
        return not self.broken and all(p.is_alive() for p in self.procs)

    def kill(self):
        self.broken = True
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(5)
        if self.store is not None:
            self.store.close()
            self.store = None

    def close(self):
        if self.broken:
            return self.kill()
        for c in self.conns:
            try:
                c.send(None)
            except Exception:
                pass
        for p in self.procs:
            p.join(10)
        self.kill()


_POOLS: dict = {}


def get_pool(size: int, env: dict | None = None, timeout: float = 120.0, own: str | None = None) -> RankPool:
    """A session-cached pool of ``size`` ranks with extra environment ``env``. ``own``: a name
    that keeps the pool apart from every other module's, for a test that needs its ranks in a
    state no other module touched (e.g. no device engine on the pool's communicator: the counting
    tests of tests/stream), whatever order the modules run in."""
    key = (size, tuple(sorted((env or {}).items())), own)
    pool = _POOLS.get(key)
    if pool is None or not pool.alive():
        if pool is not None:
            pool.kill()
        pool = _POOLS[key] = RankPool(size, timeout=timeout, env=env)
    return pool


def close_pools():
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
