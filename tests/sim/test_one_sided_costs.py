"""The simulator's cost of one-sided schedules (docs/simulator.md): a get of n bytes from a peer
crosses the links from that peer like a transfer (latency + bytes over the bottleneck, reducing as
it arrives for a get_reduce), a put the links to it, and a signal costs one latency before the
waiting step may start. On the closed-form topology (every rank its own host and NIC) the mapped
algorithms' times are reproduced exactly from those rules."""
import pytest

import commlib._C as _C
from commlib.core.call_spec import COLLECTIVE
from test_closed_forms import ALPHA, BETA, GAMMA, uniform


def simulated(collective, algorithm, count, P, elem=4, topo=None):
    return _C.simulate(COLLECTIVE[collective], algorithm, count, elem, 0, topo or uniform(P))


@pytest.mark.parametrize("P", [2, 4, 8])
def test_mapped_all_gather_is_three_signal_latencies_plus_the_reads(P):
    # ready signal (alpha), P-1 concurrent gets into this rank's NIC ((P-1) m beta + alpha), done
    # signal (alpha).
    m = 4 * 1000
    out = simulated("all_gather", "mapped", 1000, P)
    assert out["time_s"] == pytest.approx(3 * ALPHA + (P - 1) * m * BETA, rel=1e-12)
    assert out["transfers"] == P * (P - 1) and out["bytes_inter"] == P * (P - 1) * m
    assert simulated("all_gather", "mapped", 0, P)["time_s"] == pytest.approx(3 * ALPHA, rel=1e-12)


@pytest.mark.parametrize("P", [2, 4, 8])
def test_mapped_two_shot_reads_one_peer_per_step(P):
    # P-1 get_reduce steps each alpha + m (beta + gamma) (every rank reads a different peer, so no
    # link is shared), the ready and result signals, one gather step of P-1 concurrent gets
    # (alpha + (P-1) m beta) and the done signal: (P+3) alpha + 2 f n beta + f n gamma.
    n = 4 * 1024 * P
    f = (P - 1) / P
    out = simulated("all_reduce", "mapped_two_shot", n // 4, P)
    assert out["time_s"] == pytest.approx((P + 3) * ALPHA + 2 * f * n * BETA + f * n * GAMMA, rel=1e-12)


@pytest.mark.parametrize("P", [2, 4, 8])
def test_the_fused_two_shot_is_a_get_reduce_and_a_put_with_every_peer_in_one_step(P):
    # ready (alpha); one step in which every rank reads its block m = n / P from every peer
    # (get_reduce) and stores the sum into every peer (put): each NIC direction carries 2 (P-1) m,
    # all from the step's entry; result (alpha). So 3 alpha + 2 f n beta and the reduction's tail m gamma,
    # where the two-shot of get_reduce steps pays a latency per step: (P + 3) alpha.
    n = 4 * 1024 * P
    f, m = (P - 1) / P, n // P
    out = simulated("all_reduce", "mapped_fused_two_shot", n // 4, P)
    assert out["transfers"] == 2 * P * (P - 1) and out["bytes_inter"] == 2 * P * (P - 1) * m
    lower = 3 * ALPHA + 2 * f * n * BETA
    assert out["time_s"] == pytest.approx(lower + m * GAMMA, rel=1e-12), (out["time_s"], lower)  # one block's reduction at the tail
    two_shot = simulated("all_reduce", "mapped_two_shot", n // 4, P)["time_s"]
    assert out["time_s"] < two_shot


@pytest.mark.parametrize("P", [2, 4, 8])
def test_the_fused_reduce_scatter_is_a_get_reduce_from_every_peer_in_one_step(P):
    # ready (alpha); one step in which every rank reads its block m = n / P of every peer's input
    # (get_reduce, reduced as it arrives): each NIC direction carries (P-1) m from the step's entry;
    # done (alpha). So 3 alpha + f n beta and the reduction's tail m gamma; the mapped one of one peer per
    # step pays (P - 1) latencies for the same bytes.
    n = 4 * 1024 * P  # input bytes per rank
    f, m = (P - 1) / P, n // P
    out = simulated("reduce_scatter", "mapped_fused", m // 4, P)
    assert out["transfers"] == P * (P - 1) and out["bytes_inter"] == P * (P - 1) * m
    lower = 3 * ALPHA + f * n * BETA
    # the reduction's tail: one block of m (a get that did not reduce would end at `lower`)
    assert out["time_s"] == pytest.approx(lower + m * GAMMA, rel=1e-12), (out["time_s"], lower)
    mapped = simulated("reduce_scatter", "mapped", m // 4, P)["time_s"]
    assert out["time_s"] < mapped if P > 2 else out["time_s"] == pytest.approx(mapped)  # P = 2: one peer either way


@pytest.mark.parametrize("P", [2, 4, 8])
def test_mapped_one_shot_reads_everything_then_sums(P):
    # ready (alpha), P-1 whole-buffer gets into this rank's NIC (alpha + (P-1) n beta), done (alpha),
    # then P-1 local reductions of n bytes.
    n = 4 * 1000
    out = simulated("all_reduce", "mapped_one_shot", 1000, P)
    assert out["time_s"] == pytest.approx(3 * ALPHA + (P - 1) * n * (BETA + GAMMA), rel=1e-12)


def test_reads_of_one_peer_share_its_port():
    # all_to_all over one host: every rank's P-1 gets leave through the peers' ports and arrive
    # through its own; a slower port shows up in the time, like a transfer on that link.
    P = 4
    t = uniform(P)
    t.update(host_of=[0] * P, intra_latency_s=ALPHA)
    fast = simulated("all_to_all", "mapped", 1000, P, topo=t)["time_s"]
    t["intra_port_Bps"] /= 2
    slow = simulated("all_to_all", "mapped", 1000, P, topo=t)["time_s"]
    assert slow - 3 * ALPHA == pytest.approx(2 * (fast - 3 * ALPHA), rel=1e-12)
    assert simulated("all_to_all", "mapped", 1000, P, topo=t)["bytes_intra"] == P * (P - 1) * 4000


def test_every_one_sided_algorithm_is_costed_and_auto_never_picks_one():
    one_sided = [(c, a["name"]) for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
                 for a in _C.algorithm_info(COLLECTIVE[c]) if "one_sided" in a["traits"]]
    assert len(one_sided) == 7
    for c, a in one_sided:
        for P in (1, 3, 6):
            assert simulated(c, a, 97, P)["time_s"] >= 0
    # With per-message CPU overheads (LogGP's o) the one-sided schedules, which post no messages,
    # are the model's fastest; auto (with this topology as its cost model) still never picks one.
    t = uniform(8)
    t.update(send_overhead_s=2e-5, recv_overhead_s=2e-5)
    for c, _ in one_sided:
        names = set(_C.algorithms(COLLECTIVE[c])) - {"hierarchical"}
        for nbytes in (8, 1 << 16):
            times = {a: simulated(c, a, nbytes // 4, 8, topo=t)["time_s"] for a in names}
            assert (c, min(times, key=times.get)) in one_sided
            assert (c, simulated(c, "auto", nbytes // 4, 8, topo=t)["algorithm"]) not in one_sided
