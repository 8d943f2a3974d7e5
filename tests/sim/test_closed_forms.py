"""The closed forms of docs/simulator.md ("Closed forms") reproduced by the simulator on a uniform topology without contention
(every rank its own host and NIC, one latency alpha, one bandwidth 1/beta, reductions at 1/gamma,
no chunk pipelining, no software overheads): the simulated time equals the formula to rounding
(relative 1e-12; the simulator sums the same terms in a different order)."""
import math

import pytest

import commlib._C as _C
from commlib.core.call_spec import COLLECTIVE

ALPHA, BETA, GAMMA = 3e-6, 1.0 / 12.5e9, 1.0 / 40e9


def uniform(P):
    return {"host_of": list(range(P)), "nic_of": [0] * P, "nics_per_host": 1,
            "intra_latency_s": ALPHA, "intra_port_Bps": 1 / BETA, "intra_bus_Bps": 0.0,
            "inter_latency_s": ALPHA, "nic_Bps": 1 / BETA, "reduce_s_per_byte": GAMMA,
            "copy_s_per_byte": 0.0, "op_overhead_s": 0.0, "step_overhead_s": 0.0, "chunk_bytes": 0}


def closed_form(collective, algorithm, n, P):
    """n: the nccl-tests size in bytes (all_reduce buffer, all_gather output, all_to_all buffer)."""
    a, b, g, f, L = ALPHA, BETA, GAMMA, (P - 1) / P, math.log2(P)
    return {
        ("all_reduce", "ring"): 2 * (P - 1) * a + 2 * f * n * b + f * n * g,
        ("all_reduce", "recursive_doubling"): L * a + n * L * b + n * L * g,
        ("all_reduce", "rabenseifner"): 2 * L * a + 2 * f * n * b + f * n * g,
        ("all_gather", "ring"): (P - 1) * a + f * n * b,
        ("all_gather", "recursive_doubling"): L * a + f * n * b,
        ("all_to_all", "bruck"): L * a + n / 2 * L * b,
        ("all_to_all", "pairwise"): (P - 1) * a + f * n * b,
    }[(collective, algorithm)]


def simulated(collective, algorithm, n, P, elem=4):
    per_rank = n // elem if collective == "all_reduce" else n // elem // P
    return _C.simulate(COLLECTIVE[collective], algorithm, per_rank, elem, 0, uniform(P))["time_s"]


CASES = [("all_reduce", "ring"), ("all_reduce", "recursive_doubling"), ("all_reduce", "rabenseifner"),
         ("all_gather", "ring"), ("all_gather", "recursive_doubling"), ("all_to_all", "bruck"),
         ("all_to_all", "pairwise")]


@pytest.mark.parametrize("collective,algorithm", CASES, ids=[f"{c}-{a}" for c, a in CASES])
def test_closed_form_powers_of_two(collective, algorithm):
    for P in (2, 4, 8, 16, 64, 256):
        for n in (P * P * 4, P * P * 4 * 1024, P * P * 4 * 65536):
            assert simulated(collective, algorithm, n, P) == pytest.approx(
                closed_form(collective, algorithm, n, P), rel=1e-12), (P, n)


def test_ring_closed_form_any_world_size():
    for P in (3, 5, 6, 7, 12, 100):
        n = P * 4 * 997
        assert simulated("all_reduce", "ring", n, P) == pytest.approx(
            closed_form("all_reduce", "ring", n, P), rel=1e-12), P


def test_4096_rank_ring_all_reduce_is_exact_and_fast():
    # 4096 ranks x 2(P-1) = 8190 ring steps each (33.5M transfers): the formula still holds exactly.
    P, n = 4096, 4096 * 4 * 64
    out = _C.simulate(_C.Collective.all_reduce, "ring", n // 4, 4, 0, uniform(P))
    assert out["steps"] == out["transfers"] == P * 2 * (P - 1)
    assert out["time_s"] == pytest.approx(closed_form("all_reduce", "ring", n, P), rel=1e-12)
    assert out["shapes"] <= 4 * P  # compaction: a handful of step shapes per rank
