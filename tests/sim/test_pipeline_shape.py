"""How finely a pipelined hierarchical all_reduce is cut is the cost model's choice
(policy/pipeline_shape.h): its segments and lane pieces come from an analytic one-rank estimate,
never from the full simulator. Over a grid of (preset, nodes, size, composition): the shape it
chooses is never slower in the simulator than the plain (one-segment) schedule; where the fixed
rule's shape (COMMLIB_HIER_SEGMENT, the builder's own piece cap) lost to plain, it wins; its
estimate is within 15 % of the simulated time (within 1-2 % from 16 MiB; the largest miss, 12 %, at
4 MiB on 16 nodes, where ranks drift out of the lock step it assumes); and auto's candidates carry
the chosen shape."""
import pytest

from commlib import _C
from commlib.sim.engine import load

MiB = 1 << 20
AR = _C.Collective.all_reduce
# The built-in exchange, registered inter algorithms with built-in and registered intra phases.
COMPOSITIONS = [("", ""), ("two_shot", ""), ("two_shot", "ring"), ("rabenseifner", "")]
GRID = [("dgx-h100", 2, size) for size in (4 * MiB, 64 * MiB, 1024 * MiB)]
GRID += [("dgx-h100", 16, 4 * MiB), ("dgx-h100", 16, 64 * MiB), ("dgx-a100", 16, 64 * MiB)]


def placed(preset, nodes):
    t = load(preset)
    return t.engine_dict(nodes * t.devices_per_host)


def simulated(d, count, inter, intra, segment, pieces=0):
    return _C.simulate(AR, "hierarchical", count, 4, 0, d, inter, segment, intra, pieces=pieces)["time_s"]


@pytest.mark.parametrize("preset,nodes,size", GRID, ids=[f"{p}-{n}n-{s // MiB}MiB" for p, n, s in GRID])
def test_chosen_shape_never_slower_than_plain(preset, nodes, size):
    d = placed(preset, nodes)
    count = size // 4
    for inter, intra in COMPOSITIONS:
        shape = _C.pipeline_shape(AR, count, 4, d, inter, intra)
        chosen = simulated(d, count, inter, intra, shape["segment"], shape["pieces"])
        plain = simulated(d, count, inter, intra, 0)
        where = (preset, nodes, size, inter, intra, shape)
        assert chosen <= plain, (where, chosen, plain)
        assert abs(shape["estimate_s"] - chosen) <= 0.15 * chosen, (where, shape["estimate_s"], chosen)


def test_the_rules_slow_points_are_pipelined_faster_than_plain():
    """16 dgx-h100 nodes, 64 MiB, two_shot between hosts and ring inside them: the fixed rule's 16
    segments ran slower than the plain schedule (0.79 against 0.70 ms) while the NVLink messages'
    overheads were CPU time (0.58 against 0.66 since they are the GPU's: intra_by_device); the
    model's shape is faster than both, and pipelined."""
    d = placed("dgx-h100", 16)
    count = 64 * MiB // 4
    shape = _C.pipeline_shape(AR, count, 4, d, "two_shot", "ring")
    assert shape["segment"] > 0
    chosen = simulated(d, count, "two_shot", "ring", shape["segment"], shape["pieces"])
    assert min(simulated(d, count, "two_shot", "ring", -1), simulated(d, count, "two_shot", "ring", 0)) > chosen


def test_auto_candidates_carry_the_chosen_shape():
    d = placed("dgx-h100", 2)
    count = 64 * MiB // 4
    by_phases = {(c["inter_algorithm"], c["intra_algorithm"]): c
                 for c in _C.predict_candidates(AR, count, 4, 0, d) if c["algorithm"] == "hierarchical"}
    for inter, intra in COMPOSITIONS:
        shape = _C.pipeline_shape(AR, count, 4, d, inter, intra)
        cand = by_phases[(inter, intra)]
        assert (cand["segment"], cand["pieces"]) == (shape["segment"], shape["pieces"]), (inter, intra)
        assert cand["predicted_s"] == simulated(d, count, inter, intra, shape["segment"], shape["pieces"])


def test_flat_and_one_host_calls_are_left_alone():
    d = placed("dgx-h100", 1)
    assert _C.pipeline_shape(AR, 1 << 20, 4, d, "two_shot", "")["estimate_s"] == -1


def test_a_kept_shape_is_the_one_its_model_and_call_would_choose_afresh():
    """choose_pipeline_shape keeps its choices (one costs up to 34 schedule builds): every input
    must be in the key. The same call on two models that differ in one field (the NIC's rate), and
    two counts on one model, each get what a cleared cache computes for them."""
    d = placed("dgx-h100", 2)
    slow = dict(d, nic_Bps=d["nic_Bps"] / 64)
    asked = [(d, 64 * MiB // 4), (slow, 64 * MiB // 4), (d, 4 * MiB // 4), (slow, 4 * MiB // 4)]
    fresh = []
    for model, count in asked:
        _C.clear_candidate_cache()
        fresh.append(_C.pipeline_shape(AR, count, 4, model, "two_shot", "ring"))
    assert len({(f["segment"], f["pieces"], f["estimate_s"]) for f in fresh}) == 4, fresh
    _C.clear_candidate_cache()
    for _ in range(2):  # the first round fills the cache, the second reads it
        for (model, count), want in zip(asked, fresh):
            assert _C.pipeline_shape(AR, count, 4, model, "two_shot", "ring") == want, (count, model["nic_Bps"])
