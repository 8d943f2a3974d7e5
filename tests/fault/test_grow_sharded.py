"""Growing back with sharded state (issue #40): ZeroOptimizer (stages 1 and 2) and
FullyShardedModule move every piece of their parameters, gradients and optimizer state to the
layout of the grown world, joiners included, and a shrink reloads a checkpoint (the dead rank's
pieces had no replica) or refuses without one.

The reference for every rank is the same wrapper built at the new size that loads a sharded
checkpoint written just before the grow or the death: what it holds must equal what the grown or
shrunk wrapper holds bit for bit (the move copies bytes), and two more steps on both must stay
equal bit for bit (the same collectives on the same communicator)."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

pytest.importorskip("torch")

import grow_sharded_cases as gsc  # noqa: E402
from commlib.testing import JoinablePool  # noqa: E402


def _check_grown(results, joined, members, size):
    for k, kind in enumerate(gsc.KINDS):
        before = results[0][k][0]  # gathered on the members before the grow: the same on each
        ranks = [r[k][1] for r in results] + [j[k] for j in joined]
        assert sorted(r[0] for r in ranks) == list(range(size)), (kind, ranks)
        for rank, grown_size, everything, got, want, got_after, want_after in ranks:
            where = f"{kind}, rank {rank} of {grown_size} (grown from {members})"
            assert grown_size == size, where
            assert everything == before, f"{where}: the whole parameters, gradients or state changed"
            assert got == want, f"{where}: its pieces differ from a load of the checkpoint at the grown size"
            assert got[1] == [gsc.SCHEDULED_LR], f"{where}: lr {got[1]}, rank 0's was {gsc.SCHEDULED_LR}"
            assert got_after == want_after, f"{where}: training went on differently"


# 2 -> 3 on two emulated hosts (member 1 and the joiner on the second: the pieces travel over tcp
# and shm), and 3 -> 5 on one host (two joiners; then a joiner that dies during the move, and a
# member that dies: the survivors shrink from the checkpoint)
@pytest.mark.timeout(150)
@pytest.mark.parametrize("members,joiners,hosts", [(2, 1, ("a", "b")), (3, 2, None)],
                         ids=["2to3_two_hosts", "3to5_then_shrink"])
def test_sharded_state_moves_to_the_grown_layout_exactly(members, joiners, hosts, tmp_path):
    with JoinablePool(members, timeout=90, env={"COMMLIB_HOST_ID": hosts} if hosts else None) as pool:
        extra = [pool.joiner(gsc.joiner_grows, str(tmp_path), members, env={"COMMLIB_HOST_ID": hosts[-1]}
                             if hosts else None) for _ in range(joiners)]
        results = pool.run(gsc.case_grow, pool.store.port, joiners, str(tmp_path))
        joined = [e.result(90) for e in extra]
        shrunk = None
        if members == 2:  # a joiner built with other arguments: refused everywhere, nothing moved
            others = [pool.joiner(gsc.joiner_with_other_units, kind, env={"COMMLIB_HOST_ID": hosts[-1]})
                      for kind in ("fsdp", "zero2")]
            refused = pool.run(gsc.case_joiners_with_other_units, pool.store.port) + [[o.result(60) for o in others]]
        if members == 3:
            doomed = pool.joiner(gsc.joiner_dies)
            recovered = pool.run(gsc.case_joiner_dies_during_the_move, pool.store.port, str(tmp_path))
            assert doomed.result(60, allow_death=True) is None
            shrunk = pool.run(gsc.case_kill_shrink, pool.store.port, 2, str(tmp_path), allow_death=True)
    _check_grown(results, joined, members, members + joiners)
    if shrunk is None:
        for fsdp, zero in refused:  # members', then the joiners'
            assert (fsdp or "").startswith("the ranks' sharded units differ (rank 0's: 0 of 42, 2 of 24; "), fsdp
            assert "'bucket g0.float32.b0 (from bucket_cap_mb)': shape (31,) on rank 0 but (66,) on rank 2" in (zero or ""), zero
        return
    # a joiner died during the move: every member raised, and shrink(checkpoint=) recovered
    for rank, (raised, size, got, want) in enumerate(recovered):
        assert (raised, size) == (("PeerError", 4), 3) and got == want, (rank, raised, size)
    assert shrunk[2] is None
    for rank in (0, 1):
        for kind, (raised, refused, new_rank, size, got, want, got_after, want_after) in shrunk[rank].items():
            where = f"{kind}, survivor {rank}"
            assert raised == "PeerError" and (new_rank, size) == (rank, 2), (where, raised, new_rank, size)
            assert refused.startswith("checkpoint: ") and "dead ranks' shards are gone" in refused, (where, refused)
            assert got == want and got_after == want_after, f"{where}: differs from a load at 2 ranks"


def test_shrink_without_a_checkpoint_refuses_before_anything_is_sent():
    """Wrappers with no communicator at all: the refusals come before any use of one."""
    import torch

    from commlib.parallel import FullyShardedModule, ZeroOptimizer
    for cls, what in ((ZeroOptimizer, "optimizer state lived"), (FullyShardedModule, "and of the parameters")):
        wrapper = object.__new__(cls)
        with pytest.raises(ValueError, match=f"checkpoint: {cls.__name__}.shrink needs a sharded checkpoint.*{what}"):
            cls.shrink(wrapper)
        with pytest.raises(FileNotFoundError, match="no sharded checkpoint"):
            cls.shrink(wrapper, checkpoint="/nonexistent/commlib-checkpoint")
    with pytest.raises(TypeError, match="optimizer: a function of the parameters"):
        FullyShardedModule.joined(torch.nn.Linear(1, 1), None, optimizer=3)
