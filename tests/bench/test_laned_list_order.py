"""bench/laned_list_order.py, the A/B forms of the laned schedules (issue #39): the list-order form is
the very schedule the laned call runs, on the bench's host map (before session 28 it was built for one
host unless LANED_AB_HOSTS was set, so an A/B with ``--hosts 2`` compared rail_ring's 4 rail channels
with the one-host ring and its reverse), and the merged-rounds form is proven by the verifier."""
import importlib
import os
import sys

import pytest

import commlib
from commlib import _C
from commlib.core.call_spec import COLLECTIVE

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench")


@pytest.fixture
def forms(monkeypatch):
    """The module imported (its forms registered in this process), unregistered afterwards, last first."""
    monkeypatch.syspath_prepend(BENCH)
    monkeypatch.delenv("LANED_AB_HOSTS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    mod = importlib.reload(sys.modules["laned_list_order"]) if "laned_list_order" in sys.modules else \
        importlib.import_module("laned_list_order")
    yield mod
    for collective, algorithm in reversed(mod.MERGED):
        commlib.unregister_algorithm(collective, f"{algorithm}_merged_rounds")
    for collective, algorithm in reversed(mod.LANED):
        commlib.unregister_algorithm(collective, f"{algorithm}_in_list_order")


def test_host_map_from_the_bench(forms, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # commlib bench --np 8 --hosts 2
    assert forms.hosts_of(8) == [0] * 4 + [1] * 4
    monkeypatch.setenv("LANED_AB_HOSTS", "1")  # an explicit setting wins
    assert forms.hosts_of(8) == [0] * 8
    monkeypatch.delenv("LANED_AB_HOSTS")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="LANED_AB_HOSTS"):
        forms.hosts_of(8)


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter"])
def test_forms_are_the_laned_schedule(forms, monkeypatch, collective):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    hosts, count = [0] * 4 + [1] * 4, 8 * 1009 + {"all_reduce": 1, "all_gather": 2, "reduce_scatter": 3}[collective]
    for rank in range(8):
        laned = _C.schedule(COLLECTIVE[collective], "rail_ring", rank, 8, count, 0, _C.DType.float32, hosts)
        assert laned["lanes"] == 4  # 4 rail channels on 2 hosts of 4
        listed = _C.schedule(COLLECTIVE[collective], "rail_ring_in_list_order", rank, 8, count, 0, _C.DType.float32,
                             hosts)
        assert listed["steps"] == laned["steps"], rank
        merged = _C.schedule(COLLECTIVE[collective], "rail_ring_merged_rounds", rank, 8, count, 0, _C.DType.float32,
                             hosts)
        # one step per round: every channel's k-th step's ops, in list order
        assert len(merged["steps"]) == max(laned["step_lanes"].count(k) for k in range(4)), rank
        assert sorted(map(repr, (o for st in merged["steps"] for o in st))) == \
            sorted(map(repr, (o for st in laned["steps"] for o in st))), rank
    assert commlib.verify(collective, "rail_ring_merged_rounds", 8, count) == "rail_ring_merged_rounds"
