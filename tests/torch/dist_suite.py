"""Run PyTorch's own generic distributed tests (``DistributedTest._DistTestBase``) on a backend.

    python tests/torch/dist_suite.py --backend commlib --world-size 2 [--world-size 3 ...]
        --json out.json [-k NAME ...] [--select 3=NAME ...]

The suite is instantiated the way upstream's test_distributed_spawn.py does, with forked rank
processes (fast: the parent has torch imported already). The module is imported with
BACKEND=gloo, so its decorators and test bodies behave exactly as for gloo (tests that gloo runs
are run, even those gated on the backend's *name*); with ``--backend commlib`` every group the
suite creates on gloo (the default group, ``new_group``, subgroups) is created on commlib instead.
Writes {world size: {"outcomes": {test name: "pass" | "fail" | "skip"}, "seconds": {...}}} as
JSON; test_torch_suite.py compares it with gloo's recorded passes (suite_gloo_passes.json, from
``--backend gloo`` runs). Several world sizes run in one process: torch is imported once.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
import unittest

# Upstream's knobs, read at import by the suite: keep them as for a gloo run on CPU.
os.environ["BACKEND"] = "gloo"
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120")
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _route_to_commlib():
    """Create on commlib every group the suite asks gloo (or the default backend) for."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import commlib.torch  # noqa: F401  (registers "commlib")

    def swap(backend):
        return backend.replace("gloo", "commlib") if isinstance(backend, str) else backend

    def opts(pg_options):
        return pg_options if isinstance(pg_options, commlib.torch.Options) else None

    orig_init, orig_new = c10d.init_process_group, c10d.new_group

    def init_process_group(backend=None, *args, pg_options=None, **kwargs):
        return orig_init(swap(backend) or "commlib", *args, pg_options=opts(pg_options), **kwargs)

    def new_group(ranks=None, timeout=None, backend=None, pg_options=None, *args, **kwargs):
        return orig_new(ranks, timeout, swap(backend), opts(pg_options), *args, **kwargs)

    for mod in (dist, c10d):
        mod.init_process_group = init_process_group
        mod.new_group = new_group


def _quick_barrier(dt):
    """The suite's file barrier (``Barrier.sync``: every rank passes two per test) looked at its
    files every 0.1 s, and the parent looked at the ranks every 0.1 s: tenths of a second of
    sleep per test on a 0.3 s test. Same files, same lock, same timeout; the first looks come
    after a millisecond, then the wait doubles up to 20 ms."""
    def sync(cls, wait_for=None, timeout=10):
        import torch.distributed as dist
        wait_for = dist.get_world_size() if wait_for is None else wait_for
        cls.barrier_id += 1
        folder = os.path.join(os.environ["TEMP_DIR"], "barrier")
        with dt._lock():
            with open(os.path.join(folder, str(os.getpid())), "w") as f:
                f.write(str(cls.barrier_id))
        deadline, pause = time.monotonic() + timeout, 0.001
        while True:
            with dt._lock():
                arrived = 0
                for name in os.listdir(folder):
                    with open(os.path.join(folder, name)) as f:
                        arrived += int(f.read()) >= cls.barrier_id
            if arrived == wait_for:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("barrier timeout")
            time.sleep(pause)
            pause = min(2 * pause, 0.02)

    dt.Barrier.sync = classmethod(sync)


def _wait_for_ranks(case):
    """Returns once every rank process of ``case`` exited, one failed, or the test's timeout
    passed (then upstream's _join_processes finds them so without its 0.1 s polling, and judges
    exit codes and timeouts as before)."""
    from multiprocessing.connection import wait

    from torch.testing._internal.common_distributed import get_timeout
    deadline = time.monotonic() + get_timeout(case.id())
    running = list(case.processes)
    while running and time.monotonic() < deadline:
        wait([p.sentinel for p in running], timeout=max(0.0, deadline - time.monotonic()))
        running = [p for p in running if p.exitcode is None]
        if any(p.exitcode == case.TEST_ERROR_EXIT_CODE for p in case.processes):
            return


class _Collect(unittest.TextTestResult):
    """Records every test's outcome by its short name."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.outcomes: dict = {}
        self.times: dict = {}
        self._t0 = 0.0

    @staticmethod
    def _name(test):
        return test.id().rsplit(".", 1)[-1]

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome):
        self.outcomes[self._name(test)] = outcome
        self.times[self._name(test)] = round(time.monotonic() - self._t0, 2)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "fail")

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "fail")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skip")

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "pass")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "fail")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("commlib", "gloo"), required=True)
    ap.add_argument("--world-size", type=int, action="append", required=True,
                    help="run at this many ranks (repeatable: one process imports torch once)")
    ap.add_argument("--json", required=True, help="where to write the outcomes, by world size")
    ap.add_argument("-k", action="append", default=[],
                    help="run only tests whose name contains this (repeatable)")
    ap.add_argument("--select", action="append", default=[], metavar="WS=NAME",
                    help="at world size WS, run only tests whose name contains NAME (repeatable)")
    ap.add_argument("--passed-in", help="run only the tests this JSON lists for this world size "
                    "(suite_gloo_passes.json): the rest skip on CPU anyway, and forking ranks for "
                    "them costs time")
    ap.add_argument("--exclude", action="append", default=[],
                    help="skip tests whose name contains this (repeatable)")
    args = ap.parse_args(argv)
    selections: dict = {}
    for item in args.select:
        ws, _, name = item.partition("=")
        selections.setdefault(int(ws), []).append(name)
    if args.backend == "commlib":
        _route_to_commlib()
    report = {}
    for world_size in args.world_size:
        outcomes, seconds = _run_at(world_size, args, selections.get(world_size, []))
        report[str(world_size)] = {"outcomes": outcomes, "seconds": seconds}
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    return 0


def _run_at(world_size, args, selection):
    """Runs the suite at ``world_size`` ranks; returns ({name: outcome}, {name: seconds})."""
    # The module reads WORLD_SIZE in decorators at import (require_world_size): imported anew for
    # each world size (torch and the rest of its imports, the costly part, stay loaded).
    os.environ["WORLD_SIZE"] = str(world_size)
    import importlib

    from torch.testing._internal.distributed import distributed_test as dt
    dt = importlib.reload(dt)
    _quick_barrier(dt)
    fork = multiprocessing.get_context("fork").Process

    class Suite(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._start_processes(fork)

        def _join_processes(self, fn):
            _wait_for_ranks(self)
            super()._join_processes(fn)

    names = unittest.TestLoader().getTestCaseNames(Suite)
    if args.passed_in:
        with open(args.passed_in) as f:
            passed = set(json.load(f)[str(world_size)])
        names = [n for n in names if n in passed]
    for wanted in (args.k, selection):
        if wanted:
            names = [n for n in names if any(k in n for k in wanted)]
    names = [n for n in names if not any(x in n for x in args.exclude)]
    suite = unittest.TestSuite(Suite(n) for n in names)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=1, resultclass=_Collect)
    result = runner.run(suite)
    return result.outcomes, result.times


if __name__ == "__main__":
    sys.exit(main())
