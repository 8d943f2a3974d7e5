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
