"""Regression tests for the four causes of #12 found by torch's own suite (each also runs there:
test_torch_suite.py); rank-side code in regression_cases.py."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

torch = pytest.importorskip("torch")

import regression_cases as rc  # noqa: E402
from commlib.testing import get_pool  # noqa: E402

@pytest.mark.parametrize("n", [2, 3])
def test_all_gather_coalesced_keeps_torchs_layout(n):
    get_pool(n).run(rc.case_all_gather_coalesced_layout)


def test_sparse_all_reduce_matches_gloo():
    sums = get_pool(3).run(rc.case_sparse_all_reduce)
    assert len(set(sums)) == 1


def test_barrier_timeout_names_the_timeout_not_the_variable():
    get_pool(3).run(rc.case_barrier_timeout_message)


@pytest.mark.parametrize("n", [2, 3])
def test_recv_without_src(n):
    senders = get_pool(n).run(rc.case_recv_any_source)
    assert len(senders[0]) == n


def test_blocking_fast_path_works_keep_their_values():
    get_pool(2).run(rc.case_blocking_work_values)
