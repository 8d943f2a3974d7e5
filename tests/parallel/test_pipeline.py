"""Pipeline schedules (GPipe, 1F1B, interleaved, zero-bubble) with 2 and 4 ranks, one and two stages
per rank, m in {1, P, 2P+1} micro-batches, an uneven layer split: losses, every parameter's gradient
and the final parameters equal single-process training over 3 SGD steps (float64, within
pp_cases.PP_TOL = 1e-10; see its docstring). The whole matrix of a world size runs in one pool call."""
import pytest

from commlib.parallel.pipeline import actions as A
from parallel import pp_cases as C


@pytest.mark.parametrize("P", [2, 4])
def test_every_schedule_matches_single_process(pool, P):
    cases = C.matrix_for(P)
    results = pool(P).run(C.run_matrix, cases, timeout=240)
    for rank, per_rank in enumerate(results):
        assert [r["case"] for r in per_rank] == [tuple(c) for c in cases]
        for r in per_rank:
            worst = max(r["loss"], r["grad"], r["param"])
            assert worst <= C.PP_TOL, (rank, r)
            kind, v, m, _ = r["case"]
            # the runtime held exactly what the schedule's order says it holds
            orders = A.build_orders(kind, P * v, P, m)
            assert r["peak_in_flight"] == A.peak_in_flight(orders)[rank], (rank, r)
            assert r["peak_activation_bytes"] <= r["peak_in_flight"] * r["per_mb_bytes"], (rank, r)


@pytest.mark.parametrize("kind", A.KINDS)
@pytest.mark.parametrize("P,v", [(1, 1), (1, 3), (2, 1), (2, 2), (3, 1), (3, 2), (4, 1), (4, 2)])
def test_orders_complete_without_deadlock(kind, P, v):
    if kind == "interleaved" and v == 1 and P > 1:
        pytest.skip("interleaved needs several stages per rank")
    for m in sorted({1, 2, P, 2 * P + 1, 8}):
        orders = A.build_orders(kind, P * v, P, m)
        A.check_orders(orders, P * v, P, m, zero_bubble=kind == "zero_bubble")


def test_memory_bounds_of_the_orders():
    """GPipe holds all m micro-batches on every rank; 1F1B at most P - r on rank r."""
    P, m = 4, 9
    assert A.peak_in_flight(A.build_orders("gpipe", P, P, m)) == [m] * P
    assert A.peak_in_flight(A.build_orders("1f1b", P, P, m)) == [P - r for r in range(P)]


def test_check_orders_catches_a_deadlock():
    orders = A.build_orders("1f1b", 2, 2, 2)
    swapped = [list(reversed(orders[0])), orders[1]]  # backward before its forward on rank 0
    with pytest.raises(AssertionError, match="deadlock"):
        A.check_orders(swapped, 2, 2, 2)
