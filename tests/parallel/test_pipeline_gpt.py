"""The tiny GPT on a Mesh: 3D (tp2 pp2 dp2) and 4D (tp2 cp2 pp2) pipelines, and a looping pipeline
with dp, equal to single-process training (float64, pp_gpt_cases.GPT_PP_TOL = 1e-10); the mesh's
layout; wrong use of the pipeline API."""
import pytest

from parallel import pp_cases as C
from parallel import pp_gpt_cases as G

MESHES = [  # (tp, cp, pp, dp, schedule, stages per rank, micro-batches, steps, blocks)
    (2, 1, 2, 2, "1f1b", 1, 2, 2, 3),
    (2, 2, 2, 1, "zero_bubble", 1, 2, 2, 3),
    (1, 1, 2, 4, "interleaved", 2, 2, 2, 5),
]


@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: f"tp{m[0]}-cp{m[1]}-pp{m[2]}-dp{m[3]}-{m[4]}")
def test_gpt_mesh_matches_single_process(pool, mesh):
    res = pool(8).run(G.gpt_mesh_train, *mesh, timeout=240)
    assert any("loss" in r for r in res)
    worst = max(max(r.values()) for r in res)
    assert worst <= G.GPT_PP_TOL, res


def test_mesh_layout(pool):
    res = pool(8).run(C.mesh_layout, 2, 1, 2, 2)
    for rank, r in enumerate(res):
        tp, pp, dp = r["coords"]["tp"], r["coords"]["pp"], r["coords"]["dp"]
        assert rank == (dp * 2 + pp) * 2 + tp
        assert r["tp"] == [rank - tp, rank - tp + 1]             # TP ranks are neighbours
        assert r["pp"] == [rank - 2 * pp, rank - 2 * pp + 2]
        assert r["dp"] == [rank - 4 * dp, rank - 4 * dp + 4]
        assert r["cp"] == [rank]


def test_wrong_use_gets_clear_errors(pool):
    res = pool(2).run(C.wrong_use)
    assert res[0][:5] == res[1][:5]  # the exchanged errors read the same on every rank


def test_a_failing_stage_fails_its_neighbours_at_once(pool):
    msgs = pool(2).run(C.failing_stage)
    assert "stage exploded" in msgs[0] and "stage exploded" in msgs[1]
