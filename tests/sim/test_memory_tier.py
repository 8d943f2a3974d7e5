"""The memory-hierarchy term: a rank whose working set (input + output + scratch) exceeds a
memory tier's above_bytes moves, copies and reduces at that tier's rates; fitted:<bench.json>
recovers the thresholds and every level's rates from a bench run with cache cliffs; bad
parameters are named."""
import json

import pytest

from commlib import sim
import commlib._C as _C
from commlib.sim.fit import working_set_bytes
from commlib.sim.topology import TopologyError, load


def one_host(P, port_Bps=1e9, reduce_s_per_byte=0.0):
    return {"host_of": [0] * P, "nic_of": [0] * P, "nics_per_host": 1, "intra_latency_s": 0.0,
            "intra_port_Bps": port_Bps, "intra_bus_Bps": 0.0, "inter_latency_s": 0.0, "nic_Bps": 0.0,
            "reduce_s_per_byte": reduce_s_per_byte, "copy_s_per_byte": 0.0, "op_overhead_s": 0.0,
            "step_overhead_s": 0.0, "chunk_bytes": 0}


def test_ranks_beyond_the_cache_use_the_memory_rates():
    # 2-rank ring all_gather of 2 x m bytes: one transfer of m bytes per rank; working set 3m
    # (input m, output 2m, no scratch).
    m = 1 << 20
    t = one_host(2, port_Bps=4e9)

    def tiers(first, second):
        return dict(t, memory_tiers=[{"above_bytes": first, "port_Bps": 2e9, "reduce_s_per_byte": 0.0,
                                      "copy_s_per_byte": 0.0},
                                     {"above_bytes": second, "port_Bps": 1e9, "reduce_s_per_byte": 0.0,
                                      "copy_s_per_byte": 0.0}])
    inside = _C.simulate(_C.Collective.all_gather, "ring", m, 1, 0, tiers(3 * m, 4 * m))
    middle = _C.simulate(_C.Collective.all_gather, "ring", m, 1, 0, tiers(3 * m - 1, 3 * m))
    beyond = _C.simulate(_C.Collective.all_gather, "ring", m, 1, 0, tiers(m, 3 * m - 1))
    assert inside["max_working_set_bytes"] == beyond["max_working_set_bytes"] == 3 * m
    assert (inside["ranks_beyond_cache"], middle["ranks_beyond_cache"], beyond["ranks_beyond_cache"]) == (0, 2, 2)
    assert inside["time_s"] == pytest.approx(m / 4e9, rel=1e-12)
    assert middle["time_s"] == pytest.approx(m / 2e9, rel=1e-12)
    assert beyond["time_s"] == pytest.approx(m / 1e9, rel=1e-12)
    # no tiers: one set of rates, whatever the size
    assert _C.simulate(_C.Collective.all_gather, "ring", m, 1, 0, t)["time_s"] == pytest.approx(m / 4e9, rel=1e-12)


def test_reductions_beyond_the_cache_use_the_memory_reduce_rate():
    # 2-rank ring all_reduce of n bytes: recv_reduce n/2 then recv n/2 (no chunking).
    n = 1 << 20
    t = dict(one_host(2, port_Bps=4e9, reduce_s_per_byte=1 / 8e9),
             memory_tiers=[{"above_bytes": 1, "port_Bps": 4e9, "reduce_s_per_byte": 1 / 1e9, "copy_s_per_byte": 0.0}])
    got = _C.simulate(_C.Collective.all_reduce, "ring", n, 1, 0, t)["time_s"]
    assert got == pytest.approx(n / 4e9 + (n / 2) / 1e9, rel=1e-12)


def test_working_set_counts_scratch():
    # recursive doubling receives the partner's whole vector into scratch before reducing it
    n = 1 << 16
    ring = working_set_bytes("all_reduce", "ring", n, "float32", 2)
    rd = working_set_bytes("all_reduce", "recursive_doubling", n, "float32", 2)
    assert ring == 2 * n and rd > ring


def cliff_bench(P, machine):
    """Bench rows predicted by the simulator on `machine` (what a noiseless machine would give)."""
    recs = []
    for coll, alg in (("all_reduce", "ring"), ("all_reduce", "recursive_doubling"), ("all_gather", "ring"),
                      ("all_to_all", "pairwise")):
        for k in range(3, 25):
            r = sim.predict(coll, alg, 1 << k, P, machine)
            recs.append(dict(r, backend="commlib", transport="shm"))
    return {"results": recs}


def fitted(tmp_path, truth):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(cliff_bench(2, truth)))
    return str(path), load(f"fitted:{path}")


def test_fitted_topology_recovers_a_cache_cliff(tmp_path):
    truth = sim.Topology(name="truth", devices_per_host=2, intra_latency_us=1.5, call_overhead_us=2.0,
                         intra_GBps=8.0, reduce_GBps=20.0, copy_GBps=12.0,
                         memory_tiers=({"above_bytes": 1 << 20, "intra_GBps": 2.0, "reduce_GBps": 5.0,
                                        "copy_GBps": 3.0},))
    path, t = fitted(tmp_path, truth)
    # The threshold: the largest working set measured at or below the true one (1 MiB is measured:
    # ring all_reduce of 512 KiB), the cliff recorded as lying before the next one measured.
    assert [m["above_bytes"] for m in t.memory_tiers] == [1 << 20]
    assert "a cliff between 1048576 and" in t.sources["memory_tiers"]
    (m,) = t.memory_tiers
    for got, want in ((t.intra_GBps, 8.0), (t.reduce_GBps, 20.0), (t.copy_GBps, 12.0), (m["intra_GBps"], 2.0),
                      (m["reduce_GBps"], 5.0), (m["copy_GBps"], 3.0), (t.intra_latency_us, 1.5),
                      (t.call_overhead_us, 2.0)):
        assert got == pytest.approx(want, rel=1e-6)
    # and without tiers the same bench cannot be fitted: the one-level fit misses the big sizes
    one = sim.from_bench(path, tiers=False)
    assert one.memory_tiers == ()
    big = sim.predict("all_gather", "ring", 1 << 24, 2, one)["time_us"]["median"]
    real = sim.predict("all_gather", "ring", 1 << 24, 2, truth)["time_us"]["median"]
    assert big < 0.6 * real
    assert sim.predict("all_gather", "ring", 1 << 24, 2, t)["time_us"]["median"] == pytest.approx(real, rel=1e-6)


def test_fitted_topology_recovers_two_cliffs(tmp_path):
    truth = sim.Topology(name="truth", devices_per_host=2, intra_latency_us=1.0, call_overhead_us=3.0,
                         intra_GBps=10.0, reduce_GBps=30.0, copy_GBps=15.0,
                         memory_tiers=({"above_bytes": 1 << 19, "intra_GBps": 4.0, "reduce_GBps": None,
                                        "copy_GBps": 6.0},
                                       {"above_bytes": 1 << 23, "intra_GBps": 1.0, "reduce_GBps": 4.0,
                                        "copy_GBps": 2.0}))
    _, t = fitted(tmp_path, truth)
    assert [m["above_bytes"] for m in t.memory_tiers] == [1 << 19, 1 << 23]
    want = truth.resolved_tiers()
    for got, exp in zip(t.resolved_tiers(), want):
        for k in ("intra_GBps", "reduce_GBps", "copy_GBps"):
            assert got[k] == pytest.approx(exp[k], rel=1e-6), k


def test_no_cliff_fits_one_level(tmp_path):
    flat = sim.Topology(name="flat", devices_per_host=2, intra_latency_us=1.0, intra_GBps=6.0, reduce_GBps=15.0)
    _, t = fitted(tmp_path, flat)
    assert t.memory_tiers == () and t.intra_GBps == pytest.approx(6.0, rel=1e-6)


def write(tmp_path, obj):
    p = tmp_path / "topo.json"
    p.write_text(json.dumps(obj))
    return str(p)


def tier(above, **rates):
    return {"above_bytes": above, **rates}


@pytest.mark.parametrize("tiers,message", [
    ({"above_bytes": 1}, r"field 'memory_tiers' must be a list of objects"),
    ([5], r"memory_tiers\[0\] must be an object"),
    ([tier(0)], r"memory_tiers\[0\].above_bytes must be an integer > 0"),
    ([tier(1 << 20), tier(1 << 20)], r"memory_tiers\[1\].above_bytes must be an integer > 0 and above the tier"),
    ([tier(1.5)], r"memory_tiers\[0\].above_bytes must be an integer"),
    ([tier(4096, intra_GBps=0)], r"memory_tiers\[0\].intra_GBps must be a number > 0"),
    ([tier(4096, copy_GBps="slow")], r"memory_tiers\[0\].copy_GBps must be a number > 0"),
    ([tier(4096, dram_GBps=3)], r"memory_tiers\[0\]: unknown field\(s\) dram_GBps"),
])
def test_bad_memory_tiers_are_named(tmp_path, tiers, message):
    with pytest.raises(TopologyError, match=message):
        load(write(tmp_path, {"base": "eth-25g", "memory_tiers": tiers}))


def test_memory_tiers_in_a_file_and_null_rates(tmp_path):
    t = load(write(tmp_path, {"base": "eth-25g", "devices_per_host": 2, "memory_tiers": [
        {"above_bytes": 4096, "intra_GBps": 2.5, "reduce_GBps": None}, {"above_bytes": 1 << 20, "copy_GBps": 1}]}))
    d = t.engine_dict(2)
    assert [m["above_bytes"] for m in d["memory_tiers"]] == [4096, 1 << 20]
    assert d["memory_tiers"][0]["port_Bps"] == pytest.approx(2.5e9)
    assert d["memory_tiers"][0]["reduce_s_per_byte"] == pytest.approx(1 / 10e9)  # null: the tier before's
    assert d["memory_tiers"][1]["port_Bps"] == pytest.approx(2.5e9)              # left out: the tier before's
    assert d["memory_tiers"][1]["copy_s_per_byte"] == pytest.approx(1e-9)
    assert "beyond 4096 B per device" in t.describe() and load(write(tmp_path, t.as_json())) == t


def test_engine_names_a_bad_memory_tier():
    good = {"above_bytes": 1024, "port_Bps": 1e9, "reduce_s_per_byte": 0.0, "copy_s_per_byte": 0.0}
    for bad, msg in ((dict(good, port_Bps=0.0), r"memory_tiers\[0\].port_Bps: must be a finite number > 0"),
                     ({k: v for k, v in good.items() if k != "port_Bps"}, r"memory_tiers\[0\].port_Bps: missing"),
                     (dict(good, extra=1), r"memory_tiers\[0\]: unknown field"),
                     (dict(good, above_bytes=0), r"memory_tiers\[0\].above_bytes: must be > 0")):
        with pytest.raises(ValueError, match="^topology." + msg):
            _C.simulate(_C.Collective.all_reduce, "ring", 10, 4, 0, dict(one_host(2), memory_tiers=[bad]))
    with pytest.raises(ValueError, match=r"^topology.memory_tiers\[1\].above_bytes: must be > 0 and above"):
        _C.simulate(_C.Collective.all_reduce, "ring", 10, 4, 0, dict(one_host(2), memory_tiers=[good, good]))


def test_a_topology_with_tiers_is_hashable_and_equal_to_its_copy():
    from commlib.sim.topology_model import Topology
    tiers = ({"above_bytes": 1 << 20, "intra_GBps": 2.0, "reduce_GBps": 5.0, "copy_GBps": None},)
    a = Topology("t", devices_per_host=2, intra_latency_us=1.0, intra_GBps=8.0, memory_tiers=tiers)
    b = Topology("t", devices_per_host=2, intra_latency_us=1.0, intra_GBps=8.0, memory_tiers=list(tiers))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a.memory_tiers[0]["reduce_GBps"] == 5.0 and dict(a.memory_tiers[0]) == tiers[0]
    c = Topology("t", devices_per_host=2, intra_latency_us=1.0, intra_GBps=8.0,
                 memory_tiers=({"above_bytes": 2 << 20, "intra_GBps": 2.0},))
    assert a != c
    assert a.as_json()["memory_tiers"][0]["above_bytes"] == 1 << 20
