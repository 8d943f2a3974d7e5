"""torch over commlib when a rank is SIGKILLed mid-training: the survivors shrink the default group
with dist.shrink_group (SHRINK_ABORT) and train on, under (a) dist.all_reduce of the gradients and
(b) torch DDP (then FSDP2 on the shrunk group); parameters equal a one-process replay exactly in
float64 (training_replay.py: every sum is exact; after the shrink DDP sums through a comm hook, as
its default hook would divide by 3). FSDP2 averages over 3: compared within 1e-12 relative."""
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


def _cpp_backend() -> bool:
    from commlib.torch import native
    return native.load() is not None


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
        params, members_by_step, message, dead, new_rank, shrunk = results[r]
        assert f"rank {victim}" in message and "PeerError" in message, message
        if _cpp_backend():  # torch's own path: its ProcessGroup, the C++ backend it registered itself
            assert shrunk == {"group": "ProcessGroup", "cpu_backend": "CommlibBackend"}, shrunk
        assert dead == [victim]
        assert new_rank == survivors.index(r)
        assert members_by_step == _members(size, victim)
        assert params == want, (r, np.frombuffer(params), np.frombuffer(want))


@pytest.mark.timeout(150)
def test_ddp_survivors_raise_then_shrink_group_and_train_on_then_fsdp2():
    """Regression first: the survivors' loss.backward() raises a Python exception naming the dead
    rank (it used to die of SIGSEGV: the bucket future was failed with Future.set_exception, which
    C++ readers took for a value). Then DDP on the shrunk group, then FSDP2."""
    size, victim = 4, 1
    results = run_killing_one_rank(size, victim, ftc.case_ddp_shrink, timeout=120, args=(KILL_STEP,))
    members = _members(size, victim)
    # DDP averages over 4 ranks before the failure (exact: a power of two), sums after (hook)
    want = tr.replay(members, [size] * KILL_STEP + [1] * (tr.STEPS - KILL_STEP)).tobytes()
    survivors = [r for r in range(size) if r != victim]
    fsdp_want = np.tile(tr.replay([survivors] * 2, [len(survivors)] * 2), 2)
    assert results[victim] is None
    for r in survivors:
        assert results[r] is not None, f"rank {r} crashed instead of raising"
        params, members_by_step, message, took, fsdp = results[r]
        assert f"rank {victim}" in message and "died" in message, message
        assert took < 30, took
        assert members_by_step == members
        assert params == want, (r, np.frombuffer(params), np.frombuffer(want))
        np.testing.assert_allclose(np.frombuffer(fsdp), fsdp_want, rtol=1e-12, atol=0)


@pytest.mark.timeout(150)
def test_commlib_data_parallel_shrinks_and_trains_on():
    """3 ranks average (step 0's sum is exact: integer gradients), rank 1 dies at step 1, the two
    survivors average from then on (a sum of two is the same in either order), so the replay with
    the same torch ops matches exactly."""
    size, victim, kill_step = 3, 1, 1
    results = run_killing_one_rank(size, victim, ftc.case_commlib_dp_shrink, timeout=120,
                                   args=(kill_step,))
    members = [[0, 1, 2]] * kill_step + [[0, 2]] * (tr.STEPS - kill_step)
    want = ftc.torch_replay(members, [3] * kill_step + [2] * (tr.STEPS - kill_step))
    for r in (0, 2):
        params, members_by_step, message, new_size = results[r]
        assert f"rank {victim}" in message and "PeerError" in message, message
        assert members_by_step == members and new_size == 2
        assert params == want, (r, np.frombuffer(params), np.frombuffer(want))
