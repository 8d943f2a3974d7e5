"""device_cases' reporting: a broken matrix shows its full extent. check_cases records every case
that raises or gives a wrong result and goes on (it used to stop after 10 exceptions), and
check_results gives the full count with the first lines. No ranks: run_case is replaced by one
that fails as told, so this runs in milliseconds."""
import os
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_cases  # noqa: E402

# (coll, algo, dtype, op, count, root, inplace), the shape run_case takes
CASES = [("all_reduce", "ring", "float32", "sum", n, 0, False) for n in range(25)]


def _broken_run_case(comm, case):
    """Case n: raises when n is even, a wrong result when n % 3 == 1, else passes."""
    n = case[4]
    if n % 2 == 0:
        raise RuntimeError(f"broken engine at count={n}")
    if n % 3 == 1:
        return f"{case} rank={comm.rank}: wrong result", None, None
    return None, f"case {n}", "digest"


def test_check_cases_reports_every_failing_case(monkeypatch):
    monkeypatch.setattr(device_cases, "run_case", _broken_run_case)
    comm = types.SimpleNamespace(rank=0, size=1)
    failures, digests = device_cases.check_cases(comm, CASES)
    raised = [n for n in range(25) if n % 2 == 0]
    wrong = [n for n in range(25) if n % 2 and n % 3 == 1]
    assert len(failures) == len(raised) + len(wrong) == 17
    assert sum("raised RuntimeError: broken engine" in f for f in failures) == len(raised)
    assert sum(f.endswith("wrong result") for f in failures) == len(wrong)
    # the passing cases still ran, after the failures
    assert [d for d, _ in digests] == [f"case {n}" for n in range(25) if n % 2 and n % 3 != 1]


def test_check_results_gives_the_count_and_the_first_lines(monkeypatch):
    monkeypatch.setattr(device_cases, "run_case", _broken_run_case)
    results = [device_cases.check_cases(types.SimpleNamespace(rank=r, size=2), CASES) for r in range(2)]
    with pytest.raises(AssertionError) as info:
        device_cases.check_results(results)
    text = str(info.value)
    assert text.startswith("34 failure(s) (one per failing case per rank) over 2 rank(s); the first 20:")
    assert sum("rank=" in line for line in text.splitlines()) == device_cases.SHOWN
