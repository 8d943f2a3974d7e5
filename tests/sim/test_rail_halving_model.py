"""rail_halving in the model (csrc/schedule/rail_halving.cc, docs/simulator.md "Halving on every
rail"): its messages are 2 log2 P per rank and segment (log L rounds each way inside the host, log H
steps each way per rail) at the hierarchical schedule's inter-host volume, it beats the flat ring by
far at 128 dgx-h100 nodes, pairing its lanes by elements beats the same phases paired by count, and
auto picks it where the model says it is fastest."""
import math

import pytest

from commlib.sim import ranking
from commlib import _C, tuning
from commlib.core.call_spec import COLLECTIVE
from commlib.sim import topology as sim_topology


@pytest.fixture
def no_tuning(monkeypatch):
    monkeypatch.delenv("COMMLIB_ALGO_ALL_REDUCE", raising=False)
    _C.clear_tuning()
    yield
    tuning.load_default()


def simulate(topo, nodes, nbytes, algorithm, segment, inter="", intra=""):
    t = sim_topology.load(topo)
    d = t.engine_dict(nodes * t.devices_per_host)
    return _C.simulate(_C.Collective.all_reduce, algorithm, nbytes // 4, 4, 0, d, inter, segment, intra)


@pytest.mark.parametrize("nodes,K", [(2, 4), (4, 16)])
def test_messages_and_inter_bytes_are_pinned(nodes, K):
    L, nbytes = 8, 4 << 20
    P, H = nodes * L, nodes
    r = simulate("dgx-h100", nodes, nbytes, "rail_halving", nbytes // 4 // K)
    assert r["segment"] == nbytes // 4 // K
    assert r["transfers"] == P * K * 2 * int(math.log2(P))
    # Bandwidth-optimal across hosts: each rank sends 2 (H-1)/H of its block (1/L of the buffer).
    assert r["bytes_inter"] == P * 2 * (H - 1) * nbytes // (H * L)


def test_beats_the_ring_at_128_nodes():
    """The flat ring crosses hosts on one NIC per host boundary in 2(P-1) = 2046 steps."""
    count = (64 << 20) // 4
    halving = simulate("dgx-h100", 128, 64 << 20, "rail_halving", count // 8)
    ring = simulate("dgx-h100", 128, 64 << 20, "ring", 0)
    assert halving["time_s"] * 5 < ring["time_s"]
    assert halving["transfers"] == 1024 * 8 * 2 * 10


def test_pairing_by_elements_beats_pairing_by_count():
    """16 dgx-h100 nodes, 1 GiB, 16 segments: the same rabenseifner steps between hosts; paired by
    elements (rail_halving) the NICs' largest steps go beside the ports' largest rounds."""
    count = (1 << 30) // 4
    halving = simulate("dgx-h100", 16, 1 << 30, "rail_halving", count // 16)
    by_count = simulate("dgx-h100", 16, 1 << 30, "hierarchical", count // 16, "rabenseifner", "ring")
    assert halving["bytes_inter"] == by_count["bytes_inter"]
    assert halving["time_s"] < 0.85 * by_count["time_s"]


def test_auto_picks_it_where_the_model_says_so(no_tuning):
    """8 dgx-a100 nodes, 64 MiB (NIC-bound: 8 x 200 Gb/s against NVLink 3): the model's fastest
    candidate in one lane; a lane per segment under a window (rail_window, session 25) faster, and
    rail_halving in lanes (rail_lanes, test_rail_lanes_model.py) faster again (rail_lanes /
    rail_window / rail_halving / the next, hierarchical two_shot: 0.620 / 0.621 / 0.725 / 0.763 ms);
    since session 32 rail_window's intra-window shape (at most 3 of a rank's steps inside the host
    in flight) is auto's pick, 0.619 ms. (1 GiB until session 30 ranks the same four alike, 9.9 / 9.9 / 10.3 / 10.5
    ms, for 1.5 times the CPU, nearly all of it the full ranking's shapes; 16 nodes alike again for
    twice that; 4 nodes rank rail_split and hierarchical above rail_halving, and at 16 MiB
    rail_window wins. Auto is resolved once, as the runtime resolves it: sim.predict's "auto", the
    same search again, was a fifth of the test's CPU; test_cli.py reads its "resolved".)"""
    t = sim_topology.load("dgx-a100")
    P = 8 * t.devices_per_host
    d = t.engine_dict(P)
    count = (64 << 20) // 4
    cands = _C.predict_candidates(COLLECTIVE["all_reduce"], count, 4, 0, d)
    best = ranking.tie_pick(c for c in cands if c["algorithm"] not in ("rail_lanes", "rail_window"))
    assert best["algorithm"] == "rail_halving"
    window = next(c for c in cands if c["algorithm"] == "rail_window")
    lanes = next(c for c in cands if c["algorithm"] == "rail_lanes")
    assert window["predicted_s"] < best["predicted_s"] and lanes["predicted_s"] < best["predicted_s"]
    got = _C.resolve_algorithm(COLLECTIVE["all_reduce"], "auto", count, 4, 0, P, d["host_of"], d)
    assert (got["source"], got["algorithm"]) == ("model", "rail_window")
    assert got["predicted_s"] <= lanes["predicted_s"]
