"""The overlapped hierarchical all_reduce in the simulator (docs/simulator.md, "Hierarchical
pipelines"): on DGX presets of equal hosts, each composition's time approaches the slower of its
phases, not their sum. The phases alone are the same schedule on the same preset with the other
kind of link made 1000x faster (and its latency and reductions free); the plain schedule is one
segment (no pipeline)."""
import pytest

from commlib import _C
from commlib.sim.topology import load

SIZE = 256 << 20  # bytes of float32
COMPOSITIONS = [("direct", ""), ("ring", "ring"), ("two_shot", "direct"), ("recursive_doubling", "rail_ring")]


def predict(preset, nodes, inter, intra, segment=-1, fast=None):
    t = load(preset)
    d = t.engine_dict(nodes * t.devices_per_host)
    if fast == "nic":
        d["nic_Bps"] *= 1000
        d["inter_latency_s"] = 0.0
    elif fast == "intra":
        d["intra_port_Bps"] *= 1000
        d["intra_latency_s"] = 0.0
        d["reduce_s_per_byte"] = 0.0
    return _C.simulate(_C.Collective.all_reduce, "hierarchical", SIZE // 4, 4, 0, d, inter, segment, intra)["time_s"]


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100"])
@pytest.mark.parametrize("inter,intra", COMPOSITIONS)
def test_time_approaches_the_slower_phase(preset, inter, intra):
    overlapped = predict(preset, 2, inter, intra)
    slower = max(predict(preset, 2, inter, intra, fast="nic"), predict(preset, 2, inter, intra, fast="intra"))
    plain = predict(preset, 2, inter, intra, segment=1 << 40)
    assert overlapped <= 1.2 * slower, (overlapped, slower)
    assert plain >= 1.3 * overlapped, (plain, overlapped)
