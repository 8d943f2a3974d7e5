"""rail_lanes in the model (csrc/schedule/rail_lanes.cc, schedule/lanes.h, docs/simulator.md "Slices
in flight"): the simulator plays each (rank, lane) as its own sequence of steps on the rank's links
(sim/run.h), so the lanes overlap; the same steps played in list order (one lane) are as slow as
rail_halving; auto picks rail_lanes where the model says it is fastest, and rail_halving or
rail_lanes requested by name take the model's shape unless COMMLIB_HIER_SEGMENT is set."""
import pytest

import commlib
from commlib import _C, tuning
from commlib.sim import topology as sim_topology

COUNT = (64 << 20) // 4  # 64 MiB of float32


@pytest.fixture
def no_tuning(monkeypatch):
    monkeypatch.delenv("COMMLIB_ALGO_ALL_REDUCE", raising=False)
    monkeypatch.delenv("COMMLIB_HIER_SEGMENT", raising=False)
    _C.clear_tuning()
    yield
    tuning.load_default()


def engine(topo, nodes):
    t = sim_topology.load(topo)
    return t.engine_dict(nodes * t.devices_per_host)


def simulate(d, algorithm, segment, count=COUNT, pieces=0):
    return _C.simulate(_C.Collective.all_reduce, algorithm, count, 4, 0, d, "", segment, "", pieces=pieces)


def test_lanes_overlap_where_list_order_does_not():
    """16 dgx-h100 nodes, 64 MiB, 4 lanes of 8 segments: the lanes' steps played as one sequence (a
    Python algorithm returning the same schedules, one lane) take the time of rail_halving's, the
    lanes beside each other at least 15 % less; the same bytes cross hosts either way."""
    d = engine("dgx-h100", 16)
    hosts = d["host_of"]
    segment = COUNT // 4 // 8
    lanes = simulate(d, "rail_lanes", segment, pieces=4)

    def build(rank, size, count, root):
        return _C.schedule(_C.Collective.all_reduce, "rail_lanes", rank, size, count, root, _C.DType.float32, hosts,
                           "", segment, "", 4)

    commlib.register_algorithm("all_reduce", "lanes_in_list_order", build)
    try:
        listed = simulate(d, "lanes_in_list_order", segment)
    finally:
        commlib.unregister_algorithm("all_reduce", "lanes_in_list_order")
    halving = simulate(d, "rail_halving", COUNT // 8)
    assert lanes["bytes_inter"] == listed["bytes_inter"] == halving["bytes_inter"]
    assert lanes["transfers"] == listed["transfers"]
    assert lanes["time_s"] < 0.85 * listed["time_s"], (lanes["time_s"], listed["time_s"])
    assert lanes["time_s"] < 0.85 * halving["time_s"], (lanes["time_s"], halving["time_s"])


def test_auto_picks_lanes(no_tuning):
    """4 dgx-h100 nodes, 64 MiB: rail_halving's lock step leaves the NICs idle a latency per small
    step (343 GB/s busbw); rail_lanes' candidate is predicted at least 360 GB/s (408; the NICs' bound
    is 410), and auto's pick is laned: rail_window (a lane per segment under a window, session 25),
    faster still. (16 nodes until session 30: 308 and 382 GB/s, the same pick, for 4 times the CPU,
    23 s of the suite; test_auto_ramps_where_the_model_says searches at 16 nodes.)"""
    d = engine("dgx-h100", 4)
    P = 32
    lanes = _C.simulate(_C.Collective.all_reduce, "rail_lanes", COUNT, 4, 0, d)  # by name: the model's shape
    assert lanes["pieces"] >= 2 and 2 * (P - 1) / P * COUNT * 4 / lanes["time_s"] >= 360e9
    r = _C.simulate(_C.Collective.all_reduce, "auto", COUNT, 4, 0, d)
    assert r["algorithm"] == "rail_window", r["algorithm"]
    assert r["time_s"] < lanes["time_s"]


@pytest.mark.parametrize("name", ["rail_halving", "rail_lanes"])
def test_requested_by_name_takes_the_models_shape(no_tuning, monkeypatch, name):
    """Requested by name (segment -1: the setting's) on the model, rail_halving and rail_lanes get
    the shape auto would give them, not COMMLIB_HIER_SEGMENT's default; with the setting set, its
    segment. (4 dgx-h100 nodes: rail_halving's model takes 8 segments, rail_lanes' 8 lanes of 16
    segments, 6 % under the best of the default 2 lanes. At 16 nodes until session 30, where
    rail_lanes' every shape played cost about 4 times the CPU.)"""
    d = engine("dgx-h100", 4)
    modelled = simulate(d, name, -1)
    best = min(simulate(d, name, COUNT // k)["time_s"] for k in (2, 4, 8, 16))  # the lanes: 2 by default
    if name == "rail_halving":  # 262144: the setting's default, COUNT / 64 (K 16 at most)
        assert modelled["segment"] != 262144 and modelled["time_s"] <= best
    else:  # the model's lanes
        assert modelled["pieces"] >= 2 and modelled["time_s"] < best
    monkeypatch.setenv("COMMLIB_HIER_SEGMENT", "65536")
    assert simulate(d, name, -1)["segment"] == 65536


@pytest.mark.parametrize("K", [4, 8])
def test_lower_bound_holds_for_lanes(K):
    """The search's lower bound of a laned candidate is its slowest lane (or its bytes through the
    rank's links), not its lanes one after another: at most the simulated time, and above the NICs'
    bytes alone."""
    d = engine("dgx-h100", 16)
    segment = COUNT // 2 // K  # the default 2 lanes
    bound = _C.candidate_lower_bound(_C.Collective.all_reduce, "rail_lanes", COUNT, 4, 0, d, "", segment)
    played = simulate(d, "rail_lanes", segment)
    assert bound <= played["time_s"], (bound, played["time_s"])
    assert bound >= played["nic_busy_s"] * 0.99, (bound, played["nic_busy_s"])


def test_auto_ranks_lanes_on_gpu_and_cpu_hosts(no_tuning):
    """On 4 hosts of 4 ranks rail_lanes is among auto's candidates whether the devices move the
    intra-host messages (the GPU presets) or the CPU does (intra_by_device 0: commlib's host
    executor, which runs lanes in flight since session 26; until session 27 it was left out there)."""
    d = engine("dgx-h100", 4)
    d = dict(d, host_of=[h for h in range(4) for _ in range(4)], nic_of=[i for _ in range(4) for i in range(4)])
    for model in (d, dict(d, intra_by_device=0)):
        names = {c["algorithm"] for c in _C.predict_candidates(_C.Collective.all_reduce, 1 << 20, 4, 0, model)}
        assert {"rail_lanes", "rail_window", "rail_halving"} <= names, names


def test_ramped_segments_shrink_the_fill(monkeypatch):
    """16 dgx-h100 nodes, 64 MiB, 4 lanes of 8 segments: each lane's first and last segment in halves
    (share 1, hierarchical_layout.h's ramp) starts the NICs and ends the ports sooner (docs/simulator.md
    "Session 23": 359.9 against 366.9 us), and the same number of bytes crosses the NICs."""
    monkeypatch.setenv("COMMLIB_HIER_SEGMENT", "1")  # the shapes given, not the model's
    d = engine("dgx-h100", 16)
    seg = COUNT // 4 // 8
    equal = _C.simulate(_C.Collective.all_reduce, "rail_lanes", COUNT, 4, 0, d, "", seg, "", pieces=4)
    ramped = _C.simulate(_C.Collective.all_reduce, "rail_lanes", COUNT, 4, 0, d, "", seg, "", pieces=4, share=1)
    assert ramped["share"] == 1 and ramped["bytes_inter"] == equal["bytes_inter"]
    assert ramped["time_s"] < 0.99 * equal["time_s"], (ramped["time_s"], equal["time_s"])


def test_auto_ramps_where_the_model_says(no_tuning):
    """4 dgx-a100 nodes, 64 MiB: auto's rail_lanes shape is ramped (8 lanes of 16 segments: 243.2
    GB/s, 240.1 equal). (16 dgx-h100 nodes, 256 MiB until session 30, 396.6 against 387.8: a
    128-rank search, 26 s of the suite; on 4 and 8 dgx-h100 nodes rail_window wins instead.) Since
    session 32 auto's pick there is rail_window (its intra-window shape, 532.9 us against rail_lanes'
    534.7), so the ramp is read from rail_lanes' ranked candidate."""
    d = engine("dgx-a100", 4)
    cands = _C.predict_candidates(_C.Collective.all_reduce, (64 << 20) // 4, 4, 0, d)
    lanes = [c for c in cands if c["algorithm"] == "rail_lanes"]
    assert len(lanes) == 1 and lanes[0]["share"] == 1, lanes


def test_huge_search_plays_the_long_lanes_ramped_only(no_tuning):
    """From 4096 ranks rail_lanes' shapes are six (a run takes minutes there), and 4 lanes of 4 and of
    16 segments are among them ramped only (share 1: where the ramp wins at 1024 dgx-h100 nodes, 300.9
    GB/s at 64 MiB and 374.8 at 1 GiB against the best equal shapes' 295.3 and 360.2), so the search
    plays six runs at most, not eight (policy/pipeline_shape.cc; docs/simulator.md "Session 24");
    below 4096 ranks every shape of 4 segments or more is played in both forms, as before."""
    count = (1 << 30) // 4

    def shapes(nodes):
        got = _C.simulated_shapes(_C.Collective.all_reduce, "rail_lanes", count, 4, engine("dgx-h100", nodes))
        return [(s["pieces"], count // s["pieces"] // s["segment"] if s["segment"] else 1, s["share"]) for s in got]

    huge = shapes(512)  # 4096 ranks
    assert sorted(huge) == sorted([(4, 4, 1), (4, 2, 0), (4, 16, 1), (4, 1, 0), (8, 2, 0), (2, 16, 0)]), huge
    below = shapes(256)  # 2048 ranks
    assert {(4, 4, 0), (4, 4, 1), (4, 8, 0), (4, 8, 1)} <= set(below), below
