"""Communicator.shrink after a SIGKILLed rank: the survivors agree, renumber and train on, and their
parameters equal a one-process replay exactly (float64; training_replay.py says why sums are
exact). Shared memory, emulated hosts over loopback TCP, and split() sub-communicators; then every
misuse (disagreeing survivors, an excluded rank calling, a second failure during the shrink, a live
rank excluded) fails on every rank, quickly."""
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import shrink_cases as sc  # noqa: E402
import training_replay as tr  # noqa: E402
from commlib.testing.faults import run_killing_one_rank  # noqa: E402

KILL_STEP = 2


def _check_training(results, victim, members_before, members_after, ranks):
    """``ranks`` trained with ``members_before`` up to the kill, ``members_after`` from then on,
    heard of the death from a PeerError naming the victim, and hold the replay's parameters."""
    members = [members_before] * KILL_STEP + [members_after] * (tr.STEPS - KILL_STEP)
    want = tr.replay(members)
    assert results[victim] is None
    for rank in ranks:
        params, members_by_step, message, _, leaks = results[rank]
        assert leaks[0] == 0 and leaks[1] <= 0 and leaks[2] <= 0, f"rank {rank}: maps, fds, threads {leaks}"
        assert members_by_step == members, (rank, members_by_step)
        assert f"rank {victim}" in message, message
        assert params == want.tobytes(), (rank, np.frombuffer(params), want)


# (ranks, victim, host of each rank or None): shared memory at 4 ranks; two emulated hosts at 4
# (the victim's host mate sees it over shm, the others over TCP).
@pytest.mark.timeout(150)
@pytest.mark.parametrize("size,victim,hosts", [(4, 2, None), (4, 1, ("a", "a", "b", "b"))],
                         ids=["shm", "two-hosts"])
def test_survivors_shrink_and_train_on(size, victim, hosts):
    env = {"COMMLIB_HOST_ID": hosts} if hosts else None
    results = run_killing_one_rank(size, victim, sc.case_train_shrink, env=env, timeout=120)
    everyone = list(range(size))
    survivors = [r for r in everyone if r != victim]
    _check_training(results, victim, everyone, survivors, survivors)


@pytest.mark.timeout(150)
def test_split_sub_communicator_shrinks():
    """Ranks 0-2 train on a split() sub-communicator, rank 3 alone; rank 2 dies. The sub-communicator
    shrinks to ranks 0-1 and the world (shrunk as well) to 0, 1, 3."""
    colors = (0, 0, 0, 1)
    results = run_killing_one_rank(4, 2, sc.case_train_shrink, timeout=120, args=(KILL_STEP, colors))
    _check_training(results, 2, [0, 1, 2], [0, 1], [0, 1])
    params, members_by_step, message, _, _ = results[3]  # alone in its group: never disturbed
    assert members_by_step == [[3]] * tr.STEPS and message is None
    assert params == tr.replay([[3]] * tr.STEPS).tobytes()
    assert [results[r][3] for r in (0, 1, 3)] == [3, 3, 3]


# four hosts: every survivor sees ranks 2-4 (the live one excluded, the one dying during the shrink,
# the first victim) only over TCP, where a failed peer that dies is known by its lost connection
@pytest.mark.timeout(150)
@pytest.mark.parametrize("hosts", [None, ("a", "a", "b", "c", "d")], ids=["shm", "four-hosts"])
def test_shrink_misuse_fails_on_every_rank(hosts):
    env = {"COMMLIB_HOST_ID": hosts} if hosts else None
    results = run_killing_one_rank(5, 4, sc.case_shrink_errors, env=env, timeout=120)
    assert results[3] is None  # the second failure
    for r in (0, 1, 2):
        msg, took = results[r]["disagree"]  # which check names it first depends on timing
        assert "RendezvousError" in msg and (
            ("exclude rank 2" in msg and "alive" in msg) or ("disagree" in msg and "[2, 4]" in msg)), (r, msg)
        assert took < 10, (r, took)
        msg, took = results[r]["excluded_caller"]
        assert "RendezvousError" in msg and "rank 2" in msg and "must not call shrink" in msg, (r, msg)
        assert took < 10, (r, took)
        msg, took = results[r]["second_failure"]
        assert "PeerError" in msg and "[3] died during the shrink" in msg, (r, msg)
        assert took < 10, (r, took)
    for r in (0, 1):
        msg, took = results[r]["live_excluded"]
        assert "RendezvousError" in msg and "exclude rank 2" in msg and "alive" in msg, (r, msg)
        assert took < 10, (r, took)
    assert "Error" in results[2]["old_comm"][0], results[2]["old_comm"]
