"""torch DDP over commlib when a rank is SIGKILLed: the survivors get a Python exception naming the
dead rank from ``loss.backward()``, never a crash.

Regression: the bucket all_reduce's future was failed with ``Future.set_exception``, which only
Python readers see as an error; DDP's reducer (C++) read the exception object as the bucket's
tensors and every survivor died of SIGSEGV inside ``loss.backward()``.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

pytest.importorskip("torch")

import fault_torch_cases as ftc  # noqa: E402
from commlib.testing.faults import run_killing_one_rank  # noqa: E402


@pytest.mark.timeout(120)
def test_ddp_survivors_raise_naming_the_dead_rank():
    victim = 2
    results = run_killing_one_rank(4, victim, ftc.case_ddp_backward_raises, timeout=90)
    assert results[victim] is None
    for rank, res in enumerate(results):
        if rank == victim:
            continue
        assert res is not None, f"rank {rank}: backward did not fail after rank {victim} died"
        msg, took = res
        assert f"rank {victim}" in msg and "died" in msg, msg
        assert took < 30, f"rank {rank} took {took:.1f} s"
