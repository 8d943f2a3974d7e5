"""A builder registered from Python is picked up everywhere the built-ins are: the registry lists
it, the verifier proves it (and catches a broken variant), ranks run it, and the bench measures
and checks it. (docs/DESIGN.md walks through this same example.)"""
import pytest

import commlib
import user_algorithms as ua

# Rank processes of their own: the algorithms registered there must not leak into other tests' pools.
POOL_ENV = {"USER_ALGORITHM_TEST": "1"}


def setup_module():
    ua.register()


def teardown_module():
    # This process's registry is shared with every later test module: leave only the built-ins
    # (newest first, the only order removal allows).
    for name in ("chain_missing_copy", "chain_oob", "chain"):
        if name in commlib.algorithms("broadcast"):
            commlib.unregister_algorithm("broadcast", name)
    assert all("user_defined" not in a["traits"] for a in commlib.algorithm_info("broadcast"))


def test_only_the_newest_user_algorithm_can_be_removed():
    for builtin in ("binomial", "no_such_algorithm"):
        with pytest.raises(ValueError, match="name"):
            commlib.unregister_algorithm("broadcast", builtin)
    with pytest.raises(ValueError, match="last algorithm registered"):
        commlib.unregister_algorithm("broadcast", "chain")  # chain_oob came after it


def test_registered_algorithm_is_listed_with_its_properties():
    assert "chain" in commlib.algorithms("broadcast")
    info = {a["name"]: a for a in commlib.algorithm_info("broadcast")}
    assert info["chain"]["traits"] == ["user_defined"] and info["chain"]["summary"] == "P-1 hops down a chain"
    assert commlib.algorithms("broadcast")[:4] == ["binomial", "scatter_allgather", "pipeline", "direct"]
    with pytest.raises(ValueError, match="already registered"):
        commlib.register_algorithm("broadcast", "chain", ua.chain_broadcast)
    with pytest.raises(ValueError, match="name"):
        commlib.register_algorithm("broadcast", "auto", ua.chain_broadcast)
    with pytest.raises(ValueError, match="collective"):
        commlib.register_algorithm("send", "mine", ua.chain_broadcast)


def test_verifier_proves_it_and_catches_a_broken_variant():
    for P in range(1, 10):
        for n in (0, 1, 7, 64):
            for root in sorted({0, P // 2, P - 1}):
                assert commlib.verify("broadcast", "chain", P, n, root) == "chain"
    commlib.register_algorithm("broadcast", "chain_missing_copy", ua.chain_broadcast_forgetting_the_root)
    with pytest.raises(commlib.VerificationError, match="chain_missing_copy"):
        commlib.verify("broadcast", "chain_missing_copy", 3, 5, 1)
    sched = commlib.schedule("broadcast", "chain", rank=2, size=4, count=6, root=1)
    assert sched["algorithm"] == "chain" and [o["op"] for s in sched["steps"] for o in s] == ["recv", "send"]


def test_ranks_run_it(pool):
    p = pool(3, env=POOL_ENV)
    for dtype in ("float32", "int64"):
        results = p.run(ua.run_chain, 1000, 1, dtype)
        for x, y in results:
            assert x == list(range(1000)) and y == [v + 1 for v in range(1000)]


def test_out_of_bounds_schedule_is_refused_before_it_runs(pool):
    errors = pool(3, env=POOL_ENV).run(ua.run_out_of_bounds)
    for rank, e in enumerate(errors):
        assert e and "broadcast/chain_oob" in e and "outside the buffer" in e and f"rank {rank}" in e, e
    # Checked when the schedule is built, before the call is numbered: the pool's communicator
    # is still in step for the next test.


def test_bench_measures_and_checks_it(pool):
    results = pool(3, env=POOL_ENV).run(ua.bench_chain)
    rows, wrong = results[0]
    assert wrong == 0
    assert {(a, b) for a, b, _ in rows} >= {("chain", 8), ("chain", 4096), ("binomial", 8)}
    assert all(w == 0 for _, _, w in rows)


def test_a_collective_takes_at_most_the_algorithms_a_call_can_number():
    # A call's description carries its algorithm as one byte whose top codes name nccl and the
    # flag calls (csrc/plan/describe.h): the registry refuses the algorithm past them, naming it.
    added = []
    try:
        with pytest.raises(ValueError, match="the most a call's description can number; 'extra_"):
            for i in range(200):
                commlib.register_algorithm("gather", f"extra_{i}", ua.chain_broadcast)
                added.append(f"extra_{i}")
        assert len(commlib.algorithms("gather")) == 0x7D, len(commlib.algorithms("gather"))
    finally:
        for name in reversed(added):
            commlib.unregister_algorithm("gather", name)
    assert not any(a.startswith("extra_") for a in commlib.algorithms("gather"))
