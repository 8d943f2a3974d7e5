"""bench/netns_acceptance.py's pure parts: the host map of a layout, the slowest-rank pass medians
and the acceptance verdicts (the measurement itself needs root: bench/RESULTS_multihost.md)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import netns_acceptance as na  # noqa: E402


def test_host_map_of_a_layout():
    assert na.host_map("2+1+3") == [0, 0, 1, 2, 2, 2]
    with pytest.raises(SystemExit, match="2\\+1\\+3"):
        na.host_map("4")


def test_pass_medians_take_the_slowest_rank_per_call():
    # [rank][pass][call]: pass 0 calls are max(1,3)=3, max(5,2)=5, max(2,2)=2 -> median 3
    ranks = [[[1, 5, 2], [10, 10, 10]], [[3, 2, 2], [1, 1, 1]]]
    assert na.pass_medians(ranks) == [3, 10]


def test_verdicts_compare_auto_with_the_best_registered_algorithm_and_ring():
    table = {16 << 20: {"ring": [0.21, 0.22], "hierarchical": [0.15, 0.14], na.AUTO: [0.14, 0.15],
                        na.AUTO_MODEL: [0.20, 0.20]}}
    choices = {16 << 20: {na.AUTO: ("hierarchical", "", "links"), na.AUTO_MODEL: ("ring", "", "model")}}
    lines = na.verdicts("2+2", table, choices)
    assert any("auto (hierarchical)" in s and "within 10%" in s for s in lines)
    assert any("auto (cost model) (ring)" in s and "MISSED" in s for s in lines)
    assert any(s.startswith("2+2, 16 MiB: ring / auto =") and "met" in s for s in lines)


def test_rail_verdicts_compare_rail_ring_with_ring_and_its_wire_floor():
    # 2+2 at 1 Gbit/s, 2 rails: 2 x 3/4 x 16 MiB / 2 rails at 1e9 x 1448/1514 bit/s = 105.3 ms
    assert na.rail_floor("2+2", 16 << 20, "1gbit", 2) == pytest.approx(0.10525, rel=1e-3)
    assert na.rail_floor("2+2+2", 16 << 20, "100mbit", 1) == pytest.approx(2.3389, rel=1e-3)
    table = {16 << 20: {"ring": [0.21, 0.22], "rail_ring": [0.11, 0.12]}}
    met = na.rail_verdicts("2+2", table, "1gbit", 2)
    assert len(met) == 1 and "1.87x (>= 1.8x: met)" in met[0] and "0.92x its wire floor" in met[0]
    table[16 << 20]["rail_ring"] = [0.15, 0.15]
    assert "MISSED (< 1.8x)" in na.rail_verdicts("2+2", table, "1gbit", 2)[0]
