"""torch.distributed._functional_collectives over "commlib", against gloo in the same processes
(in the style of upstream's test_functional_api.py). Rank-side code: funcol_cases.py.

Groups are given as a ProcessGroup, a list of ranks (with a tag), a 1-D DeviceMesh and both
dimensions of a (1, P) DeviceMesh (one spans every rank, one is each rank alone). Tolerances are
backend_cases' (fp32/fp64 rtol 1e-5, atol 1e-6; bfloat16 a few units in the last place per
reduction step; integers exact).
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

torch = pytest.importorskip("torch")

import funcol_cases as fcc  # noqa: E402
from commlib.testing import get_pool  # noqa: E402

ALL_DTYPES = ["float32", "float64", "int64", "int32", "bfloat16"]
# every dtype with a ProcessGroup; two dtypes (one float, one integer) for the other group forms
_MATRIX = [(("pg",), ALL_DTYPES),
           (("ranks", "mesh1d", "mesh2d_dim1", "mesh2d_dim0"), ["float32", "int64"])]

@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_dtype_and_group_form(n):
    counts = get_pool(n).run(_run_matrix)
    assert all(c == counts[0] and c > 100 for c in counts), counts


def _run_matrix(comm):
    return sum(fcc.case_matrix(comm, forms, dtypes) for forms, dtypes in _MATRIX)


@pytest.mark.parametrize("n", [2, 3])
def test_async_tensor_wait_semantics(n):
    assert get_pool(n).run(fcc.case_wait_semantics) == [True] * n


@pytest.mark.parametrize("n", [2, 3])
def test_autograd(n):
    assert get_pool(n).run(fcc.case_autograd) == [4] * n


def test_a_backward_through_an_async_call_is_exact_every_time():
    # 200 rounds at 3 ranks: before the completion thread's copies ran below autograd, about one
    # round in ten had a rank's gradient block zero on every rank.
    assert get_pool(3).run(fcc.case_backward_of_an_async_call_many_times) == [200] * 3


def test_compiled_functional_collectives_equal_eager_and_gloo():
    # torch.compile (aot_eager: traced and functionalized, no code generated) of functional
    # collectives on a commlib group: one graph holding every collective, results exact.
    want = ["all_gather_into_tensor", "all_reduce", "all_to_all_single", "reduce_scatter_tensor",
            "wait_tensor"]
    for seen in get_pool(2).run(fcc.case_compiled, timeout=240):
        assert seen == (want, 1), seen
