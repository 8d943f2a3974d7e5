"""The memory-hierarchy term: a rank whose working set (input + output + scratch) exceeds
cache_bytes moves, copies and reduces at the mem_* rates; fitted:<bench.json> recovers the
threshold and both tiers' rates from a bench run with a cache cliff; bad parameters are named."""
import json

import pytest

from commlib import _C, sim
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
    tier = {"mem_port_Bps": 1e9, "mem_reduce_s_per_byte": 0.0, "mem_copy_s_per_byte": 0.0}
    inside = _C.simulate("all_gather", "ring", m, 1, 0, dict(t, cache_bytes=3 * m, **tier))
    beyond = _C.simulate("all_gather", "ring", m, 1, 0, dict(t, cache_bytes=3 * m - 1, **tier))
    assert inside["max_working_set_bytes"] == beyond["max_working_set_bytes"] == 3 * m
    assert (inside["ranks_beyond_cache"], beyond["ranks_beyond_cache"]) == (0, 2)
    assert inside["time_s"] == pytest.approx(m / 4e9, rel=1e-12)
    assert beyond["time_s"] == pytest.approx(m / 1e9, rel=1e-12)
    # no cache_bytes: one tier, whatever the size
    assert _C.simulate("all_gather", "ring", m, 1, 0, t)["time_s"] == pytest.approx(m / 4e9, rel=1e-12)


def test_reductions_beyond_the_cache_use_the_memory_reduce_rate():
    # 2-rank ring all_reduce of n bytes: recv_reduce n/2 then recv n/2 (no chunking).
    n = 1 << 20
    t = dict(one_host(2, port_Bps=4e9, reduce_s_per_byte=1 / 8e9), cache_bytes=1, mem_port_Bps=4e9,
             mem_reduce_s_per_byte=1 / 1e9, mem_copy_s_per_byte=0.0)
    got = _C.simulate("all_reduce", "ring", n, 1, 0, t)["time_s"]
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


def test_fitted_topology_recovers_a_cache_cliff(tmp_path):
    truth = sim.Topology(name="truth", devices_per_host=2, intra_latency_us=1.5, call_overhead_us=2.0,
                         intra_GBps=8.0, reduce_GBps=20.0, copy_GBps=12.0, cache_bytes=1 << 20,
                         mem_intra_GBps=2.0, mem_reduce_GBps=5.0, mem_copy_GBps=3.0)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(cliff_bench(2, truth)))
    t = load(f"fitted:{path}")
    # The threshold: the largest working set measured at or below the true one (1 MiB is measured:
    # ring all_reduce of 512 KiB), the cliff recorded as lying before the next one measured.
    assert t.cache_bytes == 1 << 20
    assert "between 1048576 and" in t.sources["cache_bytes"]
    for got, want in ((t.intra_GBps, 8.0), (t.reduce_GBps, 20.0), (t.copy_GBps, 12.0), (t.mem_intra_GBps, 2.0),
                      (t.mem_reduce_GBps, 5.0), (t.mem_copy_GBps, 3.0), (t.intra_latency_us, 1.5),
                      (t.call_overhead_us, 2.0)):
        assert got == pytest.approx(want, rel=1e-6)
    # and without the tier the same bench cannot be fitted: the one-tier fit misses the big sizes
    one = sim.from_bench(str(path), tiers=False)
    assert one.cache_bytes == 0 and one.mem_intra_GBps is None
    big = sim.predict("all_gather", "ring", 1 << 24, 2, one)["time_us"]["median"]
    real = sim.predict("all_gather", "ring", 1 << 24, 2, truth)["time_us"]["median"]
    assert big < 0.6 * real
    assert sim.predict("all_gather", "ring", 1 << 24, 2, t)["time_us"]["median"] == pytest.approx(real, rel=1e-6)


def test_no_cliff_fits_one_tier_or_equal_tiers(tmp_path):
    flat = sim.Topology(name="flat", devices_per_host=2, intra_latency_us=1.0, intra_GBps=6.0, reduce_GBps=15.0)
    path = tmp_path / "flat.json"
    path.write_text(json.dumps(cliff_bench(2, flat)))
    t = load(f"fitted:{path}")
    assert t.intra_GBps == pytest.approx(6.0, rel=1e-6)
    if t.cache_bytes:  # a split that changes nothing is allowed, a fake cliff is not
        assert t.mem_intra_GBps == pytest.approx(6.0, rel=1e-6)


def write(tmp_path, obj):
    p = tmp_path / "topo.json"
    p.write_text(json.dumps(obj))
    return str(p)


@pytest.mark.parametrize("fields,message", [
    ({"mem_intra_GBps": 2.0}, r"field 'mem_intra_GBps' applies beyond cache_bytes, which is 0"),
    ({"cache_bytes": 1 << 20, "mem_reduce_GBps": 0}, r"field 'mem_reduce_GBps' must be > 0"),
    ({"cache_bytes": -1}, r"field 'cache_bytes' must be a finite number >= 0"),
    ({"cache_bytes": 1.5}, r"field 'cache_bytes' must be an integer"),
    ({"cache_bytes": 1 << 20, "mem_copy_GBps": "slow"}, r"field 'mem_copy_GBps' must be a number"),
])
def test_bad_memory_tier_fields_are_named(tmp_path, fields, message):
    with pytest.raises(TopologyError, match=message):
        load(write(tmp_path, {"base": "eth-25g", **fields}))


def test_memory_tier_in_a_file_and_null_rates(tmp_path):
    t = load(write(tmp_path, {"base": "eth-25g", "devices_per_host": 2, "cache_bytes": 4096,
                              "mem_intra_GBps": 2.5, "mem_reduce_GBps": None}))
    d = t.engine_dict(2)
    assert d["cache_bytes"] == 4096 and d["mem_port_Bps"] == pytest.approx(2.5e9)
    assert d["mem_reduce_s_per_byte"] == pytest.approx(1 / 10e9)  # null: the in-cache rate
    assert "beyond 4096 B per device" in t.describe()


def test_engine_names_a_bad_memory_tier():
    t = dict(one_host(2), cache_bytes=1024, mem_port_Bps=0.0, mem_reduce_s_per_byte=0.0, mem_copy_s_per_byte=0.0)
    with pytest.raises(ValueError, match="^topology.mem_port_Bps: must be a finite number > 0"):
        _C.simulate("all_reduce", "ring", 10, 4, 0, t)
    with pytest.raises(ValueError, match="^topology.mem_port_Bps: missing"):
        _C.simulate("all_reduce", "ring", 10, 4, 0, dict(one_host(2), cache_bytes=1024))
