"""The overlapped hierarchical all_reduce in the simulator (docs/simulator.md, "Hierarchical
pipelines"): on DGX presets of equal hosts, each composition's time approaches the slower of its
phases, not their sum. The phases alone are the same schedule on the same preset with the other
kind of link made 1000x faster (and its latency and reductions free); the plain schedule is one
segment (no pipeline)."""
import pytest

from commlib.sim.engine import hierarchical_time

SIZE = 256 << 20  # bytes of float32
COMPOSITIONS = [("direct", ""), ("ring", "ring"), ("two_shot", "direct"), ("recursive_doubling", "rail_ring")]


def predict(preset, nodes, inter, intra, segment=-1, fast=None):
    return hierarchical_time(preset, nodes, SIZE, inter, intra, segment, fast or "")


@pytest.mark.parametrize("preset", ["dgx-h100", "dgx-a100"])
@pytest.mark.parametrize("inter,intra", COMPOSITIONS)
def test_time_approaches_the_slower_phase(preset, inter, intra):
    overlapped = predict(preset, 2, inter, intra)
    slower = max(predict(preset, 2, inter, intra, fast="nic"), predict(preset, 2, inter, intra, fast="intra"))
    plain = predict(preset, 2, inter, intra, segment=1 << 40)
    assert overlapped <= 1.2 * slower, (overlapped, slower)
    assert plain >= 1.3 * overlapped, (plain, overlapped)
