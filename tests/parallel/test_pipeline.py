"""Pipeline schedules (GPipe, 1F1B, interleaved, zero-bubble) with 2 and 4 ranks, m in {1, P, 2P+1}
micro-batches, two stages per rank for the interleaved schedule (and, at m = 2P+1, for the others),
an uneven layer split: losses, every parameter's gradient and the final parameters equal
single-process training over 3 SGD steps (float64, within pp_cases.PP_TOL = 1e-10; see its
docstring). The whole matrix of a world size runs in one pool call."""
import pytest

from commlib.parallel.pipeline import actions as A
from parallel import pp_cases as C


@pytest.mark.parametrize("P", [2, 4])
def test_every_schedule_matches_single_process(pool, P):
    cases = C.matrix_for(P)
    results = pool(P).run(C.run_matrix, cases, timeout=240)
    for rank, per_rank in enumerate(results):
        assert [r["case"] for r in per_rank] == [tuple(c) for c in cases]
        for r in per_rank:
            worst = max(r["loss"], r["grad"], r["param"])
            assert worst <= C.PP_TOL, (rank, r)
            kind, v, m, _ = r["case"]
            # the runtime held exactly what the schedule's order says it holds
            orders = A.build_orders(kind, P * v, P, m)
            assert r["peak_in_flight"] == A.peak_in_flight(orders)[rank], (rank, r)
            assert r["peak_activation_bytes"] <= r["peak_in_flight"] * r["per_mb_bytes"], (rank, r)


@pytest.mark.parametrize("kind", A.KINDS)
@pytest.mark.parametrize("P,v", [(1, 1), (1, 3), (2, 1), (2, 2), (3, 1), (3, 2), (4, 1), (4, 2)])
def test_orders_complete_without_deadlock(kind, P, v):
    if kind == "interleaved" and v == 1 and P > 1:
        pytest.skip("interleaved needs several stages per rank")
    for m in sorted({1, 2, P, 2 * P + 1, 8}):
        orders = A.build_orders(kind, P * v, P, m)
        A.check_orders(orders, P * v, P, m, zero_bubble=kind == "zero_bubble")


def test_memory_bounds_of_the_orders():
    """GPipe holds all m micro-batches on every rank; 1F1B at most P - r on rank r."""
    P, m = 4, 9
    assert A.peak_in_flight(A.build_orders("gpipe", P, P, m)) == [m] * P
    assert A.peak_in_flight(A.build_orders("1f1b", P, P, m)) == [P - r for r in range(P)]


def test_check_orders_catches_a_deadlock():
    orders = A.build_orders("1f1b", 2, 2, 2)
    swapped = [list(reversed(orders[0])), orders[1]]  # backward before its forward on rank 0
    with pytest.raises(AssertionError, match="deadlock"):
        A.check_orders(swapped, 2, 2, 2)


def test_timeline_gathered_traced_and_plotted(pool, tmp_path):
    import json

    from commlib.parallel.pipeline.timeline import bubble_fraction, plot_timeline, write_chrome_trace
    m = 3
    views = pool(2).run(C.timeline_case, "zero_bubble", m)
    assert views[0] == views[1]
    ev = views[0]
    # every action of the order, once, on its rank, each with a positive duration
    want = {(r, k, r, i) for r in range(2) for i in range(m) for k in "FIW"}
    assert {(e["rank"], e["kind"], e["stage"], e["mb"]) for e in ev} == want and len(ev) == len(want)
    assert all(e["end"] > e["start"] for e in ev)
    # rank 1's forward of a micro-batch starts after rank 0's forward of it started (same clock);
    # not after its end: rank 0 sends the activation inside the action and stamps its end after
    # the send, so a descheduled rank 0 can stamp it after rank 1 already began (CI D saw it)
    f = {(e["rank"], e["mb"]): e for e in ev if e["kind"] == "F"}
    assert all(f[(1, i)]["start"] >= f[(0, i)]["start"] for i in range(m))
    assert 0.0 < bubble_fraction(ev) < 1.0
    write_chrome_trace(ev, str(tmp_path / "t.json"))
    trace = json.load(open(tmp_path / "t.json"))["traceEvents"]
    slices = [t for t in trace if t["ph"] == "X"]
    assert len(slices) == len(ev) and {t["tid"] for t in slices} == {0, 1}
    plot_timeline(ev, str(tmp_path / "t.png"), "test", theory=0.25)
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bubble_fraction_of_a_known_timeline():
    ev = [{"rank": 0, "kind": "F", "stage": 0, "mb": 0, "start": 0.0, "end": 1.0},
          {"rank": 1, "kind": "F", "stage": 1, "mb": 0, "start": 1.0, "end": 2.0},
          {"rank": 1, "kind": "B", "stage": 1, "mb": 0, "start": 2.0, "end": 3.0},
          {"rank": 0, "kind": "B", "stage": 0, "mb": 0, "start": 3.0, "end": 4.0}]
    from commlib.parallel.pipeline.timeline import bubble_fraction
    assert bubble_fraction(ev) == 0.5


@pytest.mark.parametrize("P,m", [(2, 4), (4, 8), (4, 12)])
def test_orders_reach_the_textbook_bubble(P, m):
    """Under unit costs (F=1, B=2) GPipe, 1F1B and Megatron's interleaved order hit the textbook
    bubble exactly; ZB-H1 orders beat 1F1B."""
    for kind, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)):
        assert A.order_bubble(kind, P * v, P, m) == pytest.approx(A.theory_bubble(kind, P * v, P, m)), kind
    assert A.order_bubble("zero_bubble", P, P, m) < A.theory_bubble("1f1b", P, P, m)


def test_split_backward_input_then_weight():
    """I gives the input gradient and touches no parameter; W then gives exactly the gradients of
    one whole backward, from the owners' outputs only (no second walk of the activation chain)."""
    import torch
    from torch import nn

    from commlib.parallel.pipeline import split_backward as SB
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.LayerNorm(7), nn.Linear(7, 3)).double()
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 3, dtype=torch.float64)
    model(x).backward(g)
    want = [p.grad.clone() for p in model.parameters()]
    want_x = x.grad.clone()
    model.zero_grad(set_to_none=True)
    x.grad = None
    owners = SB.param_owners(model)
    assert [type(m).__name__ for m, _ in owners] == ["Linear", "LayerNorm", "Linear"]
    with SB.Recorder(owners) as rec:
        out = model(x)
    assert rec.complete()
    gx, per_owner = SB.backward_input(out, g, x, rec)
    assert torch.allclose(gx, want_x, rtol=0, atol=1e-14)
    assert all(p.grad is None for p in model.parameters()), "I computed weight gradients"
    SB.backward_weight(rec, per_owner)
    for p, w in zip(model.parameters(), want):
        assert torch.allclose(p.grad, w, rtol=0, atol=1e-14)
    tied = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    tied[1].weight = tied[0].weight
    assert SB.param_owners(tied) is None  # tied inside a stage: the fallback


def test_stage_device_is_its_modules_and_odd_devices_are_named():
    """A stage runs on its module's device (CPU or one CUDA device; ``device=`` for a module
    without parameters): a parameter or buffer elsewhere (meta here) or on another device than the
    rest is refused at construction, naming it, before anything is sent. CUDA devices are only
    named here (torch's CPU build makes no CUDA tensor)."""
    import types

    import torch
    from torch import nn

    from commlib.parallel.pipeline import PipelineStage
    comm = types.SimpleNamespace(rank=0, size=1)  # the stage only reads rank and size here
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    stage = PipelineStage(model, 0, 1, comm)
    assert stage.module is model and stage.device == torch.device("cpu")
    assert PipelineStage(nn.Tanh(), 0, 1, comm, device="cuda").device == torch.device("cuda")
    assert PipelineStage(nn.Tanh(), 0, 1, comm).device == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^module: '0\.weight' is on cpu but the stage is on cuda"):
        PipelineStage(model, 0, 1, comm, device="cuda")
    with pytest.raises(ValueError, match=r"^device: pipeline stages run on the CPU or a CUDA device, not meta"):
        PipelineStage(nn.Tanh(), 0, 1, comm, device="meta")
    model[1].to("meta")
    with pytest.raises(ValueError, match=r"^module: '1\.weight' is on meta; pipeline stages run on the CPU or one"):
        PipelineStage(model, 0, 1, comm)
    model[1].weight, model[1].bias = nn.Parameter(torch.ones(2)), nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match=r"^module: '1\.running_mean' is on meta"):
        PipelineStage(model, 0, 1, comm)
