"""The simulator topology's fields are one list in C++ (csrc/sim/topology.h, COMMLIB_SIM_TOPOLOGY_FIELDS):
the struct, its checks, the binding's dict reader and auto's cache key are generated from it. The
Python makers of that dict (commlib/sim's Topology.engine_dict, commlib/perf's uniform model) are
checked against it here, so a field added on one side and not the other fails."""
import dataclasses

import pytest

import commlib._C as _C
from commlib.perf import model
from commlib.sim.topology import PRESETS, load

FIELDS = dict(_C.sim_topology_fields())  # name -> required
TIER_FIELDS = dict(_C.sim_memory_tier_fields())


def test_the_list_is_the_binding_s():
    assert {"host_of", "nic_of", "nic_Bps", "inter_spin_s", "memory_tiers"} <= set(FIELDS)
    assert FIELDS["host_of"] and not FIELDS["nic_gap_s"] and not FIELDS["memory_tiers"]
    assert set(TIER_FIELDS) == {"above_bytes", "port_Bps", "reduce_s_per_byte", "copy_s_per_byte"}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_engine_dict_writes_every_field(name):
    tier = {"above_bytes": 1 << 20, "intra_GBps": 10.0, "reduce_GBps": None, "copy_GBps": None}
    d = dataclasses.replace(load(name), memory_tiers=(tier,)).engine_dict(4)
    assert set(d) == set(FIELDS), f"{name}: missing {set(FIELDS) - set(d)}, unknown {set(d) - set(FIELDS)}"
    assert [set(t) for t in d["memory_tiers"]] == [set(TIER_FIELDS)]


def test_the_uniform_model_writes_the_required_fields():
    d = model._uniform(4, 1e-6, 1e9, 1e-10)
    required = {k for k, need in FIELDS.items() if need}
    assert required <= set(d) <= set(FIELDS), f"missing {required - set(d)}, unknown {set(d) - set(FIELDS)}"


def test_the_reader_takes_the_list():
    # Every required field missing, every scalar of the wrong type, and one unknown field: named.
    d = load(next(iter(sorted(PRESETS)))).engine_dict(2)
    assert _C.simulate(_C.Collective.all_reduce, "ring", 64, 4, 0, d)["time_s"] > 0
    for k, need in FIELDS.items():
        if need:
            with pytest.raises(ValueError, match=f"topology.{k}: missing"):
                _C.simulate(_C.Collective.all_reduce, "ring", 64, 4, 0, {x: v for x, v in d.items() if x != k})
        if k == "memory_tiers":
            continue  # a list of dicts, read field by field (tests/sim/test_memory_tier.py)
        with pytest.raises(ValueError, match=f"topology.{k}: wrong type"):
            _C.simulate(_C.Collective.all_reduce, "ring", 64, 4, 0, dict(d, **{k: "x"}))
    with pytest.raises(ValueError, match="topology.rails: unknown field"):
        _C.simulate(_C.Collective.all_reduce, "ring", 64, 4, 0, dict(d, rails=1))
