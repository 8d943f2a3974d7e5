"""torch over commlib when a rank is SIGKILLed mid-training: the survivors shrink the default group
with dist.shrink_group (SHRINK_ABORT) and train on, under (a) dist.all_reduce of the gradients and
(b) torch DDP (then FSDP2 on the shrunk group); parameters equal a one-process replay exactly in
float64 (training_replay.py: every sum is exact; DDP sums through a comm hook for that reason, its
default hook divides by the world size). FSDP2 averages: compared within 1e-12 relative."""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

pytest.importorskip("torch")

import fault_torch_cases as ftc  # noqa: E402
import training_replay as tr  # noqa: E402
from commlib.testing.faults import run_killing_one_rank  # noqa: E402

KILL_STEP = 2


def _members(size, victim):
    everyone = list(range(size))
    return [everyone] * KILL_STEP + [[r for r in everyone if r != victim]] * (tr.STEPS - KILL_STEP)


@pytest.mark.timeout(150)
def test_dist_all_reduce_survivors_shrink_group_and_train_on():
    size, victim = 4, 2
    results = run_killing_one_rank(size, victim, ftc.case_dist_all_reduce_shrink, timeout=120,
                                   args=(KILL_STEP,))
    want = tr.replay(_members(size, victim)).tobytes()
    survivors = [r for r in range(size) if r != victim]
    for r in survivors:
        params, members_by_step, message, dead, new_rank = results[r]
        assert f"rank {victim}" in message and "PeerError" in message, message
        assert dead == [victim]
        assert new_rank == survivors.index(r)
        assert members_by_step == _members(size, victim)
        assert params == want, (r, np.frombuffer(params), np.frombuffer(want))


@pytest.mark.timeout(150)
def test_ddp_survivors_shrink_group_and_train_on_then_fsdp2():
    size, victim = 4, 1
    results = run_killing_one_rank(size, victim, ftc.case_ddp_shrink, timeout=120, args=(KILL_STEP,))
    want = tr.replay(_members(size, victim)).tobytes()
    survivors = [r for r in range(size) if r != victim]
    fsdp_want = np.tile(tr.replay([survivors] * 2, average=True), 2)
    for r in survivors:
        params, members_by_step, message, fsdp = results[r]
        assert f"rank {victim}" in message and "died" in message, message
        assert members_by_step == _members(size, victim)
        assert params == want, (r, np.frombuffer(params), np.frombuffer(want))
        np.testing.assert_allclose(np.frombuffer(fsdp), fsdp_want, rtol=1e-12, atol=0)
