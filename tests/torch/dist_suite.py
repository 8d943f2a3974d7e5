"""Run PyTorch's own generic distributed tests (``DistributedTest._DistTestBase``) on a backend.

    python tests/torch/dist_suite.py --backend commlib --world-size 2 --json out.json [-k NAME ...]

The suite is instantiated the way upstream's test_distributed_spawn.py does, with forked rank
processes (fast: the parent has torch imported already). The module is imported with
BACKEND=gloo, so its decorators and test bodies behave exactly as for gloo (tests that gloo runs
are run, even those gated on the backend's *name*); with ``--backend commlib`` every group the
suite creates on gloo (the default group, ``new_group``, subgroups) is created on commlib instead.
Writes {test name: "pass" | "fail" | "skip"} as JSON; test_torch_suite.py compares it with gloo's
recorded passes (suite_gloo_passes.json, from ``--backend gloo`` runs).
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
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--json", required=True, help="where to write the outcomes")
    ap.add_argument("-k", action="append", default=[],
                    help="run only tests whose name contains this (repeatable)")
    ap.add_argument("--passed-in", help="run only the tests this JSON lists for this world size "
                    "(suite_gloo_passes.json): the rest skip on CPU anyway, and forking ranks for "
                    "them costs time")
    ap.add_argument("--exclude", action="append", default=[],
                    help="skip tests whose name contains this (repeatable)")
    args = ap.parse_args(argv)
    os.environ["WORLD_SIZE"] = str(args.world_size)

    from torch.testing._internal.distributed import distributed_test as dt
    if args.backend == "commlib":
        _route_to_commlib()
    fork = multiprocessing.get_context("fork").Process

    class Suite(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._start_processes(fork)

    names = unittest.TestLoader().getTestCaseNames(Suite)
    if args.passed_in:
        with open(args.passed_in) as f:
            passed = set(json.load(f)[str(args.world_size)])
        names = [n for n in names if n in passed]
    if args.k:
        names = [n for n in names if any(k in n for k in args.k)]
    names = [n for n in names if not any(x in n for x in args.exclude)]
    suite = unittest.TestSuite(Suite(n) for n in names)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=1, resultclass=_Collect)
    result = runner.run(suite)
    with open(args.json, "w") as f:
        json.dump({"outcomes": result.outcomes, "seconds": result.times}, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
