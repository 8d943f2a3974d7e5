"""Laned schedules on a CPU host's model (intra_by_device 0; sim/run.h, docs/simulator.md "Lanes on
CPU hosts"): since session 26 the host executor runs a laned call's lanes in flight (docs/DESIGN.md
"Laned calls"), so the model plays each (rank, lane) as its own player there too, as on the GPU
presets, but with one progress thread per rank: every lane's step entries, reductions of received
bytes and local copies and reductions run one after another on the rank's core. A compressed call
runs step by step in the executor, so a coded laned call there still plays its list in order.
Each test is a few milliseconds of simulation (4-32 ranks)."""
import pytest

import commlib
from commlib import _C
from commlib.sim import topology as sim_topology

NETNS = "bench/sim_data/netns_1gbit_2rails.json"


def engine(topo, ranks):
    return sim_topology.load(topo).engine_dict(ranks)


def simulate(d, algorithm, count, segment, pieces=0, **kw):
    return _C.simulate(_C.Collective.all_reduce, algorithm, count, 4, 0, d, "", segment, "", pieces=pieces, **kw)


def listed(d, count, segment, lanes, **kw):
    """rail_lanes' very steps registered as a Python algorithm: one lane, played in list order."""
    hosts = d["host_of"]

    def build(rank, size, n, root):
        return _C.schedule(_C.Collective.all_reduce, "rail_lanes", rank, size, n, root, _C.DType.float32, hosts,
                           "", segment, "", lanes)

    commlib.register_algorithm("all_reduce", "rail_lanes_listed", build)
    try:
        return simulate(d, "rail_lanes_listed", count, segment, **kw)
    finally:
        commlib.unregister_algorithm("all_reduce", "rail_lanes_listed")


def in_flight(steps):
    """The most steps of one rank between their entry and their end at one time."""
    events = sorted([(a, 1) for a, _ in steps] + [(b, -1) for _, b in steps])
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


def test_lanes_overlap_on_a_cpu_host():
    """4 dgx-h100 nodes with the CPU moving the intra-host messages, 16 MiB, 4 lanes of 4 segments:
    the lanes beside each other take under 0.6 of the same steps played as one list (90.6 against
    184.6 us when written), within 5 % of the devices' model, and the same bytes cross hosts."""
    count = (16 << 20) // 4
    segment = count // 16
    d = dict(engine("dgx-h100", 32), intra_by_device=0)
    lanes = simulate(d, "rail_lanes", count, segment, pieces=4)
    one = listed(d, count, segment, 4)
    gpu = simulate(dict(d, intra_by_device=1), "rail_lanes", count, segment, pieces=4)
    assert lanes["time_s"] < 0.6 * one["time_s"], (lanes["time_s"], one["time_s"])
    assert lanes["time_s"] == pytest.approx(gpu["time_s"], rel=0.05)
    assert lanes["bytes_inter"] == one["bytes_inter"]


def fast_links(**kw):
    """2 hosts of 2 ranks (the netns fit's placement, two rails) with links that cost next to nothing,
    so what is left is the CPU's work."""
    d = engine(NETNS, 4)
    base = dict(memory_tiers=[], nic_Bps=50e9, nic_burst_bytes=0.0, intra_port_Bps=50e9, inter_latency_s=1e-6,
                copy_s_per_byte=0.0, reduce_s_per_byte=0.0)
    return dict(d, **dict(base, **kw))


def test_a_cpu_hosts_lanes_reduce_on_its_one_core():
    """Reductions at 0.5 GB/s, 4 MiB, 4 lanes of 4 segments: each rank reduces 3/4 of the buffer
    (rail_halving's reduce-scatter: half inside the host, a quarter across), one lane's bytes after
    another's on its one thread, so the call takes at least 3/4 n gamma (6.29 ms); where the devices
    reduce (intra_by_device 1, nothing else differs: no per-message costs here) the lanes' reductions
    overlap, under half of it (1.22 ms)."""
    count = (4 << 20) // 4
    gamma = 1 / 0.5e9
    d = fast_links(reduce_s_per_byte=gamma)
    cpu = simulate(d, "rail_lanes", count, count // 16, pieces=4)
    dev = simulate(dict(d, intra_by_device=1), "rail_lanes", count, count // 16, pieces=4)
    work = 0.75 * count * 4 * gamma
    assert cpu["time_s"] >= work * (1 - 1e-9), (cpu["time_s"], work)
    assert dev["time_s"] < 0.5 * work, (dev["time_s"], work)


def test_a_cpu_hosts_lanes_enter_their_steps_on_its_one_core():
    """A step's entry costs 10 us (step_overhead_s) and nothing else costs: on the CPU host a rank's
    steps of every lane pay it one after another (every step but each lane's first), on the devices'
    model each lane its own (1.32 ms against 0.36 when written: 136 steps a rank)."""
    count = (4 << 20) // 4
    ovh = 10e-6
    d = fast_links(step_overhead_s=ovh)
    cpu = simulate(d, "rail_lanes", count, count // 16, pieces=4)
    dev = simulate(dict(d, intra_by_device=1), "rail_lanes", count, count // 16, pieces=4)
    per_rank = cpu["steps"] // 4
    assert cpu["time_s"] >= (per_rank - 4) * ovh * (1 - 1e-9), (cpu["time_s"], per_rank)
    assert dev["time_s"] < 0.3 * (per_rank - 4) * ovh, (dev["time_s"], per_rank)


@pytest.mark.timeout(120)
def test_the_window_bounds_a_cpu_hosts_steps_in_flight():
    """rail_window on 2 dgx-h100 nodes with the CPU moving the intra-host messages, 16 segments under
    a window of 4 steps: a rank's steps overlap (more than one in flight, as the host executor runs
    them), never more than 4."""
    d = dict(engine("dgx-h100", 16), intra_by_device=0)
    count = 1 << 18
    got = _C.simulate_trace(_C.Collective.all_reduce, "rail_window", count, 4, 0, d, "", count // 16, "", pieces=4)
    most = max(in_flight(s) for s in got["steps"])
    assert 1 < most <= 4, most


def test_a_compressed_laned_call_plays_its_list_on_a_cpu_host():
    """The host executor runs a compressed call step by step: int8 messages, rail_lanes on the netns
    fit (2 hosts of 2), 4 MiB, 4 lanes: the same time as its steps listed as one lane, to rounding;
    uncompressed the lanes overlap (faster than the list)."""
    count = (4 << 20) // 4
    segment = count // 16
    d = fast_links(inter_latency_s=30e-6)
    coded = simulate(d, "rail_lanes", count, segment, pieces=4, codec="int8")
    one = listed(d, count, segment, 4, codec="int8")
    assert coded["time_s"] == pytest.approx(one["time_s"], rel=1e-12)
    raw = simulate(d, "rail_lanes", count, segment, pieces=4)
    assert raw["time_s"] < listed(d, count, segment, 4)["time_s"]
