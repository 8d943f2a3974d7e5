"""ParameterServer: the O(N) baseline still trains exactly like single-process training."""
import pytest

from parallel import dp_cases as C


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_matches_single_process(pool, world, model):
    res = pool(world).run(C.train_equivalence, "ps", model)
    C.assert_equivalent(res, what=f"ParameterServer {model} on {world} ranks")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_dedicated_server(pool, world):
    """The server only aggregates; the batch is split over the size-1 workers."""
    res = pool(world).run(C.train_equivalence, "ps", "transformer", steps=4, server_computes=False)
    C.assert_equivalent(res, what=f"ParameterServer(server_computes=False) on {world} ranks")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_single_worker_is_exact(pool, model):
    """One worker, a server that only aggregates: the reduction adds zeros and divides by one,
    so the order of operations is exactly single-process training: bitwise equal (tolerance 0)."""
    res = pool(2).run(C.train_equivalence, "ps", model, server_computes=False)
    C.assert_equivalent(res, tol=0.0, what="ParameterServer with one worker")


@pytest.mark.timeout(120)
def test_server_rank_not_zero(pool):
    res = pool(3).run(C.train_equivalence, "ps", "mlp", steps=4, server_rank=2, same_init=True)
    C.assert_equivalent(res, what="ParameterServer(server_rank=2)")


@pytest.mark.timeout(60)
def test_only_server_holds_optimizer_state(pool):
    res = pool(3).run(C.memory_report, "ps")
    assert res[0]["optimizer"] > 0
    assert res[1]["optimizer"] == 0 and res[2]["optimizer"] == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pull,reduce_algorithm", [("broadcast", "auto"), ("p2p", "binomial")])
def test_push_pull_variants(pool, pull, reduce_algorithm):
    res = pool(3).run(C.train_equivalence, "ps", "mlp", steps=4, pull=pull,
                      reduce_algorithm=reduce_algorithm)
    C.assert_equivalent(res, what=f"ParameterServer(pull={pull}, reduce={reduce_algorithm})")
