"""Rails in the model (docs/simulator.md "Rails"): the simulator charges each NIC of a host
separately, so the multi-channel rail ring (NCCL's algorithm) is predicted within 15 % of NCCL's
published multi-node numbers, and auto picks it where the model says it is fastest."""
import dataclasses

import pytest

from commlib import _C, sim, tuning
from commlib.core.call_spec import COLLECTIVE
from commlib.sim import topology as sim_topology

GIB = 1 << 30


@pytest.fixture
def no_tuning(monkeypatch):
    monkeypatch.delenv("COMMLIB_ALGO_ALL_REDUCE", raising=False)
    _C.clear_tuning()
    yield
    tuning.load_default()


def busbw(alg, nodes, topo, size=GIB):
    return sim.predict("all_reduce", alg, size, nodes * topo.devices_per_host, topo)["busbw_GBps"]


def within(value, lo, hi, tol=0.15):
    return lo * (1 - tol) <= value <= hi * (1 + tol)


def test_rail_ring_matches_nccls_published_numbers():
    # nccl-tests all_reduce_perf: DGX H100 with 8 x 400G NDR 370-385 GB/s busbw at any node count;
    # 3 DGX A100 nodes with four 200G HDR NICs 85-96 GB/s.
    h100 = sim_topology.load("dgx-h100")
    a100_4 = dataclasses.replace(sim_topology.load("dgx-a100"), name="dgx-a100-4nic", nics=4)
    assert within(busbw("rail_ring", 2, h100), 370, 385)
    assert within(busbw("rail_ring", 3, a100_4), 85, 96)


def test_each_nic_is_charged_separately():
    # One NIC per host carrying the same bandwidth as each of eight: the rail ring is NIC-bound and
    # about 8 times slower; the flat ring (one NIC per host boundary) barely changes.
    h100 = sim_topology.load("dgx-h100")
    one = dataclasses.replace(h100, name="one-nic", nics=1)
    rail8, rail1 = busbw("rail_ring", 2, h100), busbw("rail_ring", 2, one)
    assert rail8 > 6 * rail1
    assert busbw("ring", 2, h100) == pytest.approx(busbw("ring", 2, one), rel=0.05)
    assert rail8 > 5 * busbw("ring", 2, h100)


def test_auto_picks_the_rails_where_the_model_says_so(no_tuning):
    """2 dgx-h100 nodes, 256 MiB: the rail rings beside hierarchical (rail_split) are faster than the
    rail rings alone; rail_halving in lanes (rail_lanes, test_rail_lanes_model.py) is faster than
    rail_halving. Since session 27 rail_split's channels and its hierarchical part are lanes of their
    own (no step waits for another part's): faster than rail_lanes here and, with rail_window (session
    25's pick, a lane per segment under a window), auto's pick."""
    t = sim_topology.load("dgx-h100")
    P = 2 * t.devices_per_host
    d = t.engine_dict(P)
    count = (256 << 20) // 4
    cands = _C.predict_candidates(COLLECTIVE["all_reduce"], count, 4, 0, d)
    fastest = {}
    for c in cands:
        fastest[c["algorithm"]] = min(fastest.get(c["algorithm"], 1e9), c["predicted_s"])
    assert fastest["rail_split"] < fastest["rail_ring"]
    assert fastest["rail_lanes"] < fastest["rail_halving"]
    got = _C.resolve_algorithm(COLLECTIVE["all_reduce"], "auto", count, 4, 0, P, d["host_of"], d)
    # (rail_split on lanes27's branch, 1.231 ms against rail_lanes' 1.267; rail_window within a few %)
    assert got["source"] == "model" and got["algorithm"] in ("rail_split", "rail_window"), got
    assert got["predicted_s"] < fastest["rail_lanes"], (got, fastest)
    # Small messages: latency-bound, the rail ring's 2(P-1) steps lose.
    small = _C.resolve_algorithm(COLLECTIVE["all_reduce"], "auto", 256, 4, 0, P, d["host_of"], d)
    assert small["algorithm"] != "rail_ring"
