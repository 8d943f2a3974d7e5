"""Topologies: presets with a documented source for every parameter, JSON files with clear errors,
and fitted:<bench.json> recovering the machine parameters a bench run was made with."""
import json
import math

import pytest

from commlib import sim
from commlib.perf import model
from commlib.sim.topology import PRESETS, TopologyError, load


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_document_their_sources(name):
    t = load(name)
    assert t.name == name
    for field in ("devices_per_host", "nic_Gbps", "nic_efficiency", "inter_latency_us", "reduce_GBps", "memory_tiers"):
        assert t.sources.get(field), f"{name}: no source for {field}"
    d = t.engine_dict(3 * t.devices_per_host)
    assert d["host_of"][-1] == 2 and max(d["nic_of"]) < t.nics


def test_dgx_h100_parameters_from_the_datasheet():
    t = load("dgx-h100")
    assert (t.devices_per_host, t.nics, t.intra_GBps, t.nic_Gbps) == (8, 8, 450.0, 400.0)
    assert t.intra_efficiency == pytest.approx(20.6 / 25)
    d = t.engine_dict(16)
    assert d["nic_of"] == list(range(8)) * 2 and d["host_of"] == [0] * 8 + [1] * 8
    assert d["intra_port_Bps"] == pytest.approx(450e9 * 20.6 / 25)
    assert d["nic_Bps"] == pytest.approx(50e9 * 0.97)


def write(tmp_path, obj, name="topo.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(p)


def test_custom_file_with_base_overrides(tmp_path):
    t = load(write(tmp_path, {"name": "mine", "base": "eth-100g", "devices_per_host": 4, "nic_Gbps": 200}))
    assert (t.name, t.devices_per_host, t.nic_Gbps, t.inter_latency_us) == ("mine", 4, 200.0, 25.0)
    r = sim.predict("all_to_all", "pairwise", 1 << 20, 8, t)
    assert r["transport"] == "mine" and r["time_us"]["median"] > 0


def test_custom_file_without_base(tmp_path):
    t = load(write(tmp_path, {"devices_per_host": 2, "intra_latency_us": 1, "intra_GBps": 20,
                              "nic_Gbps": 10, "inter_latency_us": 10, "reduce_GBps": None}))
    assert t.name == "topo.json" and math.isinf(t.reduce_GBps)
    assert sim.predict("all_reduce", "ring", 1 << 20, 4, t)["busbw_GBps"] > 0


@pytest.mark.parametrize("content,message", [
    ("{not json", r"topo.json: not valid JSON"),
    ("[1, 2]", r"topo.json: a topology file holds one JSON object"),
    ({"base": "dgx-h999"}, r"field 'base' must name a preset"),
    ({"base": "dgx-h100", "nic_gbps": 1}, r"unknown field 'nic_gbps'"),
    ({"base": "dgx-h100", "devices_per_host": 2.5}, r"field 'devices_per_host' must be an integer"),
    ({"base": "dgx-h100", "nic_Gbps": "fast"}, r"field 'nic_Gbps' must be a number"),
    ({"base": "dgx-h100", "intra_efficiency": 1.5}, r"field 'intra_efficiency' must be in \(0, 1\]"),
    ({"base": "dgx-h100", "inter_latency_us": -1}, r"field 'inter_latency_us' must be a finite number >= 0"),
    ({"base": "dgx-h100", "intra_GBps": 0}, r"field 'intra_GBps' must be > 0"),
    ({"intra_GBps": 10}, r"missing field\(s\) devices_per_host, intra_latency_us"),
])
def test_bad_files_name_the_problem(tmp_path, content, message):
    with pytest.raises(TopologyError, match=message):
        load(write(tmp_path, content))


def test_bad_names():
    with pytest.raises(TopologyError, match="neither a preset .* nor an existing file"):
        load("no-such-topology")
    with pytest.raises(TopologyError, match="fitted:/nonexistent.json: cannot read"):
        load("fitted:/nonexistent.json")
    with pytest.raises(TopologyError, match="expected a preset name"):
        load(None)


def synthetic_bench(alpha, beta, gamma, P=2, call=0.0):
    """Bench records whose times follow the closed forms exactly (what a noiseless machine gives)."""
    recs = []
    for coll, alg in (("all_reduce", "ring"), ("all_reduce", "recursive_doubling"), ("all_gather", "ring"),
                      ("reduce_scatter", "ring"), ("all_to_all", "pairwise")):
        for n in (64, 4096, 1 << 16, 1 << 20, 1 << 24):
            a, b, c = model.coefficients(coll, alg, n, P)
            recs.append({"backend": "commlib", "transport": "shm", "collective": coll, "algorithm": alg,
                         "resolved": alg, "world_size": P, "dtype": "float32", "bytes": n,
                         "time_us": {"median": (call + a * alpha + b * beta + c * gamma) * 1e6}})
    return {"results": recs}


def test_fitted_topology_recovers_the_machine(tmp_path):
    alpha, beta, gamma, call = 2e-6, 1 / 8e9, 1 / 20e9, 5e-6
    path = write(tmp_path, synthetic_bench(alpha, beta, gamma, P=4, call=call), "bench.json")
    t = load("fitted:" + path)
    assert t.call_overhead_us == pytest.approx(5.0, rel=1e-3)
    assert t.intra_latency_us == pytest.approx(2.0, rel=1e-3)
    assert t.intra_GBps == pytest.approx(8.0, rel=1e-3)
    assert t.reduce_GBps == pytest.approx(20.0, rel=1e-3)
    # and predicts those runs back (chunk_bytes=0: the bench rows above have no pipelining)
    t0 = sim.Topology(**{**t.__dict__, "chunk_bytes": 0})
    got = sim.predict("all_reduce", "ring", 1 << 20, 4, t0)["time_us"]["median"] * 1e-6
    a, b, c = model.coefficients("all_reduce", "ring", 1 << 20, 4)
    assert got == pytest.approx(call + a * alpha + b * beta + c * gamma, rel=1e-3)


def test_fitted_rejects_non_bench_files(tmp_path):
    with pytest.raises(TopologyError, match="not a commlib bench JSON file"):
        load("fitted:" + write(tmp_path, {"foo": 1}, "x.json"))
    with pytest.raises(TopologyError, match="no commlib measurements"):
        load("fitted:" + write(tmp_path, {"results": []}, "y.json"))
