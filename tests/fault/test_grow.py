"""Growing back (issue #40): survivors of a dead rank shrink, a new process joins with
commlib.join while they call comm.grow, and training goes on at full size, equal to a one-process
replay of the same world sizes; and the errors of a grow, raised by every rank that took part."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import grow_cases as gc  # noqa: E402
import training_replay as tr  # noqa: E402
from commlib.testing import JoinablePool  # noqa: E402


# One host, and two emulated hosts (the victim and the joiner on the second: links across are TCP).
@pytest.mark.timeout(120)
@pytest.mark.parametrize("hosts", [None, ("a", "a", "b")], ids=["one_host", "two_hosts"])
def test_kill_shrink_grow_equals_a_one_process_replay(hosts):
    with JoinablePool(3, timeout=90, env={"COMMLIB_HOST_ID": hosts} if hosts else None) as pool:
        joiner = pool.joiner(gc.joiner_trains, env={"COMMLIB_HOST_ID": hosts[2]} if hosts else None)
        results = pool.run(gc.case_kill_shrink_grow, 2, pool.store.port, allow_death=True)
        joined = joiner.result(90)
    sizes = [3] * gc.KILL_AT + [2] * (gc.GROW_AT - gc.KILL_AT) + [3] * (tr.STEPS - gc.GROW_AT)
    expected = tr.replay([range(s) for s in sizes]).tolist()
    assert results[2] is None
    for r in (0, 1):
        assert results[r] == (expected, sizes), r
    assert joined == (2, expected, sizes[gc.GROW_AT:])  # the joiner takes the end: rank 2


@pytest.mark.timeout(120)
def test_grow_errors_raise_on_every_rank_and_a_retry_leaks_nothing():
    with JoinablePool(2, timeout=60) as pool:
        arguments = pool.run(gc.case_grow_arguments)
        # a join with no grow waiting for it: RendezvousError after its timeout, naming the job
        lonely = pool.joiner(gc.joiner_expecting_error, 1.0).result(30)
        # a joiner with other settings: refused on every rank, naming the setting
        other = pool.joiner(gc.joiner_expecting_error, 30, env={"COMMLIB_SHM_SLOTS": "8"})
        refused = pool.run(gc.case_grow_expecting_error, 30)
        refused_joiner = other.result(30)
        # a joiner that dies building the grown communicator (before and after the members built
        # it: seen by its pid, then through its links): PeerError on every member, nothing leaks
        died = []
        for step in ("hosts", "created"):
            doomed = pool.joiner(gc.joiner_expecting_error, 30, step)
            died.append(pool.run(gc.case_grow_expecting_error, 30))
            assert doomed.result(30, allow_death=True) is None
        # retry with a good joiner, twice: nothing is left behind
        for _ in range(2):
            good = pool.joiner(gc.joiner_checks_in)
            grown = pool.run(gc.case_grow_and_check_in)
            assert good.result(30) == 3
    assert arguments[0] == arguments[1]
    assert [m.split(":")[:2] for m in arguments[0].values()] == [
        ["ValueError", " n"], ["ValueError", " n"], ["TypeError", " timeout"], ["ValueError", " timeout"]], arguments
    assert lonely.startswith("RendezvousError: join: waited 1 s for a grow of job 'pool'"), lonely
    for msg, _ in refused:
        assert msg.startswith("RendezvousError") and "COMMLIB_SHM_SLOTS='8'" in msg, msg
    assert "COMMLIB_SHM_SLOTS='8'" in refused_joiner and refused_joiner.startswith("RendezvousError"), refused_joiner
    for msg, _ in died[0] + died[1]:
        assert msg.startswith("PeerError") and "joiner #" in msg and "died during the grow" in msg, msg
    for r in (0, 1):
        assert grown[r][:2] == (3, 3)
        before = died[0][r][1]
        assert grown[r][2] == before, f"rank {r}: fds and threads before the grows, after: {before}, {grown[r][2]}"


@pytest.mark.timeout(120)
def test_split_children_grow_at_once_then_a_member_dies_during_a_grow():
    """Two grows at once (the children of a split, each a job of its own) admit each its own
    joiner; then a member dies while the grown communicator is built: PeerError on every rank
    that took part, survivors and joiner, before the grow's 60 s timeout (the pool's 30 s
    limit on the call would fail the test first)."""
    with JoinablePool(3, timeout=30) as pool:
        extra = [pool.joiner(gc.joiner_checks_in, prefix) for prefix in ("pool/split1/c0", "pool/split1/c1")]
        children = pool.run(gc.case_split_children_grow_at_once)
        joined = [e.result(30) for e in extra]
        doomed = pool.joiner(gc.joiner_expecting_error, 60)
        died = pool.run(gc.case_grow_while_a_member_dies, 2, "hosts", allow_death=True)
        joiner_saw = doomed.result(30)
    assert children == [("pool/split1/c0", 3, 3), ("pool/split1/c1", 2, 1), ("pool/split1/c0", 3, 3)]
    assert joined == [3, 1]
    assert died[2] is None
    for msg in (died[0], died[1], joiner_saw):
        assert msg.startswith("PeerError") and "rank(s) [2]" in msg and "died during the grow" in msg, msg
