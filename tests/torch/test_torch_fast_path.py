"""The torch backend's latency path (commlib/torch/fast_path.py, csrc/bindings/fast_call.cc):
blocking all_reduce, broadcast, reduce, all_gather_into_tensor, reduce_scatter_tensor,
all_to_all_single (no split sizes) and barrier on plain CPU tensors take it, give bitwise the
general path's results (async + wait: same algorithm, same data) for every dtype the core moves,
and whatever it declines still works through the general path (checked against gloo, fp32/fp64
rtol 1e-5 / atol 1e-6: gloo sums in another order). Rank side: torch_fast_path_cases.py."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

pytest.importorskip("torch")

from commlib.testing import get_pool  # noqa: E402


def _cases():
    # Imported when a test runs, not at collection: the module imports commlib.torch, which lets
    # the core's fast path take torch tensors in every later test of this process.
    import torch_fast_path_cases
    return torch_fast_path_cases


# every dtype the core moves at 2 ranks; a smaller matrix at 3 (time budget)
_MATRIX = {2: (None, (1, 5, 1000)), 3: (("float32", "bfloat16", "int64"), (5, 1000))}


@pytest.mark.parametrize("n", [2, 3])
def test_latency_path_taken_and_equal_to_general_path(n):
    failures = [f for fails in get_pool(n).run(_cases().case_fast_matches_general, *_MATRIX[n],
                                                timeout=240) for f in fails]
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("n", [2, 3])
def test_declined_calls_take_the_general_path(n):
    failures = [f for fails in get_pool(n).run(_cases().case_declined_calls_take_the_general_path)
                for f in fails]
    assert not failures, "\n".join(failures[:20])
