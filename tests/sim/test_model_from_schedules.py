"""bench/model.py's alpha-beta-gamma coefficients come from the schedules (via the simulator), not
from a table per algorithm name: closed forms where docs/simulator.md has them, every registered
algorithm modelled, unknown names refused instead of silently modelled as ring."""
import math

import pytest

import commlib._C as _C
from commlib.perf import model


def test_coefficients_match_design_closed_forms():
    P, n = 8, 8 * 4096
    f, L = (P - 1) / P, math.log2(P)
    assert model.coefficients("all_reduce", "ring", n, P) == pytest.approx((2 * (P - 1), 2 * f * n, f * n))
    assert model.coefficients("all_reduce", "rabenseifner", n, P) == pytest.approx((2 * L, 2 * f * n, f * n))
    assert model.coefficients("all_reduce", "recursive_doubling", n, P) == pytest.approx((L, n * L, n * L))
    assert model.coefficients("all_gather", "ring", n, P) == pytest.approx((P - 1, f * n, 0.0))


def test_every_registered_algorithm_has_a_model():
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
                 "scatter"):
        for alg in _C.algorithms(coll):
            a, b, c = model.coefficients(coll, alg, 1 << 16, 6)
            assert a >= 1 and b > 0, (coll, alg)
            assert (c > 0) == (coll in ("all_reduce", "reduce_scatter", "reduce")), (coll, alg)


def test_unknown_algorithm_is_an_error_not_ring():
    with pytest.raises(ValueError, match="^algorithm: unknown all_reduce algorithm 'made_up'"):
        model.coefficients("all_reduce", "made_up", 1024, 4)
