"""Rank-side functions for the pipeline tests (run by commlib.testing rank pools).

A stack of tanh(Linear) layers in float64, cut into stages unevenly, trained a few SGD steps
under every schedule; each rank compares its stages' losses, gradients and parameters with
single-process training of the same model on the same data, which it runs itself.

Tolerance PP_TOL = 1e-10 (float64): micro-batching only changes the order in which the batch's
gradient contributions are summed (per micro-batch, then across), a rounding difference of a few
ulps (~1e-15 relative) per step; 1e-10 leaves room for 3 steps of drift yet fails on any real
error (a missing or doubled micro-batch changes gradients by ~1e-2).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from commlib.parallel import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                              ScheduleZeroBubble)
from commlib.parallel.pipeline import actions as A

PP_TOL = 1e-10
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B,
             "zero_bubble": ScheduleZeroBubble}
WIDTH, STEPS, LR = 6, 3, 0.1


def split_sizes(n_layers: int, n_stages: int):
    """Uneven on purpose: the first stage takes one layer more than the rest."""
    base = [n_layers // n_stages] * n_stages
    for i in range(n_layers - sum(base)):
        base[i] += 1
    if n_stages > 1 and base[0] == base[-1]:
        base[0] += 1
        base[-1] -= 1
    return base


def make_model(n_layers: int, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers = []
    for _ in range(n_layers):
        layers += [nn.Linear(WIDTH, WIDTH).double(), nn.Tanh()]
    return nn.Sequential(*layers)


def data(batch: int, step: int):
    g = torch.Generator().manual_seed(100 + step)
    return (torch.randn(batch, WIDTH, generator=g, dtype=torch.float64),
            torch.randn(batch, WIDTH, generator=g, dtype=torch.float64))


def loss_fn(out, target):
    return ((out - target) ** 2).mean()


def sgd(params):
    """Plain SGD by hand: constructing torch.optim.SGD imports torch._dynamo (~17 s per rank
    process on a loaded 2-core machine), which these tests do not need."""
    with torch.no_grad():
        for p in params:
            p -= LR * p.grad
            p.grad = None


def _reference(n_layers, batch):
    """Single-process training: per step the loss, then every layer's (weight, bias) grads."""
    model = make_model(n_layers)
    hist = []
    for step in range(STEPS):
        x, y = data(batch, step)
        loss = loss_fn(model(x), y)
        loss.backward()
        hist.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
        sgd(model.parameters())
    return hist, [p.detach().clone() for p in model.parameters()]


def _stage_params(n_layers, sizes, st):
    """Indices (in model.parameters() order) of stage st's parameters."""
    first = sum(sizes[:st])
    return list(range(2 * first, 2 * (first + sizes[st])))


def run_case(comm, kind: str, v: int, m: int, n_layers: int, mb_size: int = 2, device: str = "cpu") -> dict:
    """Train under one schedule with the stages on ``device``; return the worst errors against the
    single-process reference (run on the CPU)."""
    P, S = comm.size, comm.size * v
    sizes = split_sizes(n_layers, S)
    batch = m * mb_size
    ref_hist, ref_final = _reference(n_layers, batch)
    full = make_model(n_layers)
    mods = list(full.children())
    stages, params = [], {}
    for st in range(comm.rank, S, P):
        first = sum(sizes[:st])
        module = nn.Sequential(*[copy.deepcopy(x) for x in mods[2 * first:2 * (first + sizes[st])]]).to(device)
        stages.append(PipelineStage(module, st, S, comm))
        params[st] = (list(module.parameters()), _stage_params(n_layers, sizes, st))
    sched = SCHEDULES[kind](stages if v > 1 else stages[0], n_microbatches=m, loss_fn=loss_fn)
    worst = {"loss": 0.0, "grad": 0.0, "param": 0.0}
    has_first, has_last = 0 in params, (S - 1) in params
    try:
        for step in range(STEPS):
            x, y = (t.to(device) for t in data(batch, step))
            losses = []
            sched.step(*([x] if has_first else []), **({"target": y, "losses": losses} if has_last else {}))
            ref_loss, ref_grads = ref_hist[step]
            if has_last:
                assert len(losses) == m, f"{len(losses)} losses for {m} micro-batches"
                worst["loss"] = max(worst["loss"], abs(sum(l.item() for l in losses) / m - ref_loss))
            for ps, idx in params.values():
                for p, i in zip(ps, idx):
                    assert p.grad is not None, f"stage parameter {i} got no gradient"
                    worst["grad"] = max(worst["grad"], (p.grad.cpu() - ref_grads[i]).abs().max().item())
            sgd([p for ps, _ in params.values() for p in ps])
        for ps, idx in params.values():
            for p, i in zip(ps, idx):
                worst["param"] = max(worst["param"], (p.detach().cpu() - ref_final[i]).abs().max().item())
        worst["peak_in_flight"] = sched.stats["peak_in_flight"]
        worst["peak_activation_bytes"] = sched.stats["peak_activation_bytes"]
        worst["per_mb_bytes"] = sched.stats["activation_bytes_per_microbatch"]
    finally:
        sched.close()
    return worst


def _threads_and_fds():
    import os
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def run_matrix(comm, cases) -> list:
    """Run every (kind, v, m, n_layers) case in turn; the errors of each, in order. Closing each
    schedule releases its lanes: no thread or file descriptor outlives the matrix."""
    torch.set_num_threads(1)
    before = _threads_and_fds()
    out = [dict(case=c, **run_case(comm, *c)) for c in cases]
    after = _threads_and_fds()
    assert after == before, f"(threads, fds) {before} before the matrix, {after} after"
    return out


def matrix_for(P: int):
    """Every kind with m in {1, P, 2P+1}: one stage per rank, the interleaved one with two; plus
    GPipe, 1F1B and zero-bubble looping (two stages per rank) at m = 2P+1. Layers: 2Pv+1, split
    unevenly."""
    ms = sorted({1, P, 2 * P + 1})
    cases = [(kind, 2 if kind == "interleaved" else 1, m) for kind in A.KINDS for m in ms]
    cases += [(kind, 2, 2 * P + 1) for kind in ("gpipe", "1f1b", "zero_bubble")]
    return [(kind, v, m, 2 * P * v + 1) for kind, v, m in cases]


def _expect(fn, *needles):
    try:
        fn()
    except (ValueError, TypeError) as e:
        msg = str(e)
        missing = [n for n in needles if n not in msg]
        assert not missing, f"error {msg!r} lacks {missing}"
        return msg
    raise AssertionError(f"no error; expected one mentioning {needles}")


def wrong_use(comm) -> list:
    """Every misuse raises a clear error on every rank, and the communicator stays usable.
    Needs 2 ranks."""
    from commlib.parallel import Mesh
    torch.set_num_threads(1)
    r = comm.rank
    msgs = []
    lin = lambda: nn.Linear(WIDTH, WIDTH).double()  # noqa: E731
    x, y = data(4, 0)

    def step(sched, batch=x, target=y):
        if r == 0:
            sched.step(batch)
        else:
            sched.step(target=target, losses=[])

    # stage counts that disagree between ranks (rank 1 believes in 4 stages: it holds 1 and 3)
    stages = PipelineStage(lin(), 0, 2, comm) if r == 0 else [PipelineStage(lin(), s, 4, comm) for s in (1, 3)]
    sched = Schedule1F1B(stages, n_microbatches=2, loss_fn=loss_fn)
    msgs.append(_expect(lambda: step(sched), "num_stages disagrees", "[2, 4]"))
    # a loss function missing on the last stage: every rank learns which rank lacks it
    sched = ScheduleGPipe(PipelineStage(lin(), r, 2, comm), n_microbatches=2, loss_fn=None if r == 1 else loss_fn)
    msgs.append(_expect(lambda: step(sched), "rank 1: loss_fn is None"))
    # n_microbatches not dividing the batch
    sched = Schedule1F1B(PipelineStage(lin(), r, 2, comm), n_microbatches=3, loss_fn=loss_fn)
    msgs.append(_expect(lambda: step(sched), "rank 0:", "n_microbatches"))
    # n_microbatches that disagree
    sched = Schedule1F1B(PipelineStage(lin(), r, 2, comm), n_microbatches=2 + r, loss_fn=loss_fn)
    msgs.append(_expect(lambda: step(sched, x[:6] if r == 0 else x, y[:6]), "n_microbatches disagrees"))
    # stage devices that disagree (a parameterless stage named CUDA: found before any device call)
    sched = Schedule1F1B(PipelineStage(nn.Tanh(), r, 2, comm, device="cuda" if r == 0 else None),
                         n_microbatches=2, loss_fn=loss_fn)
    msgs.append(_expect(lambda: step(sched), "stage device disagrees", "['cuda', 'cpu']"))
    # local errors, before anything is sent
    msgs.append(_expect(lambda: PipelineStage(lin(), 1 - r, 2, comm), "stage_index", "lives on rank"))
    msgs.append(_expect(lambda: PipelineStage(lin(), r, 3, comm), "num_stages", "evenly"))
    msgs.append(_expect(lambda: Schedule1F1B(PipelineStage(lin(), r, 2, comm), n_microbatches=0), "n_microbatches"))
    msgs.append(_expect(lambda: Mesh(comm, tp=2, pp=2), "do not multiply", "size 2"))
    msgs.append(_expect(lambda: Mesh(comm, tp=0, pp=2), "tp"))
    # a later step whose micro-batches change shape: the first stage names the agreed shape
    sched = Schedule1F1B(PipelineStage(lin(), r, 2, comm), n_microbatches=2, loss_fn=loss_fn)
    step(sched)
    if r == 0:
        # detected before anything of the step is sent; the last stage is not called
        sched.stages[0].module = nn.Sequential(lin(), nn.Flatten(0))
        msgs.append(_expect(lambda: sched.step(x), "agreed", "first step"))
    sched.close()
    # the communicator still works
    t = torch.ones(1)
    comm.all_reduce(t)
    assert t.item() == comm.size
    return msgs


def mesh_layout(comm, tp, cp, pp, dp) -> dict:
    """Each dimension's group holds the ranks differing only in that coordinate, TP innermost."""
    from commlib.parallel import Mesh
    mesh = Mesh(comm, tp=tp, cp=cp, pp=pp, dp=dp)
    out = {"coords": mesh.coords}
    for dim in ("tp", "cp", "pp", "dp"):
        g = getattr(mesh, dim)
        members = torch.zeros(g.size, dtype=torch.int64)
        g.all_gather(members, torch.tensor([comm.rank]))
        out[dim] = members.tolist()
        assert g.rank == mesh.coords[dim]
    assert mesh.rank_of(**mesh.coords) == comm.rank
    mesh.close()
    return out


def timeline_case(comm, kind: str = "1f1b", m: int = 3) -> list:
    """Run one step and return the gathered timeline (every rank's view)."""
    from commlib.parallel.pipeline.timeline import gather_timeline
    torch.set_num_threads(1)
    r = comm.rank
    full = list(make_model(2).children())
    stage = PipelineStage(nn.Sequential(*full[2 * r:2 * r + 2]), r, 2, comm)
    sched = SCHEDULES[kind](stage, n_microbatches=m, loss_fn=loss_fn)
    x, y = data(2 * m, 0)
    sched.step(*([x] if r == 0 else []), **({"target": y} if r == 1 else {}))
    events = gather_timeline(sched)
    sched.close()
    return events


class _Fails(nn.Module):
    """A stage whose forward raises at micro-batch ``at`` of its second step."""

    def __init__(self, at: int):
        super().__init__()
        self.lin, self.at, self.calls = nn.Linear(WIDTH, WIDTH).double(), at, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 2 + self.at:  # the first step runs 2 micro-batches
            raise RuntimeError("stage exploded")
        return self.lin(x)


def failing_stage(comm) -> str:
    """Rank 0's forward raises mid-step: rank 0 sees its error, rank 1 fails at once (not at the
    timeout) with an error naming rank 0; both schedules then refuse further steps."""
    import time
    torch.set_num_threads(1)
    r = comm.rank
    mod = _Fails(at=1) if r == 0 else nn.Linear(WIDTH, WIDTH).double()
    sched = Schedule1F1B(PipelineStage(mod, r, 2, comm), n_microbatches=2, loss_fn=loss_fn)
    x, y = data(4, 0)
    step = (lambda: sched.step(x)) if r == 0 else (lambda: sched.step(target=y))
    step()
    t0 = time.monotonic()
    try:
        step()
        raise AssertionError("the failing step raised nothing")
    except RuntimeError as e:
        msg = str(e)
    elapsed = time.monotonic() - t0
    assert elapsed < 0.5 * comm.timeout, f"rank {r} waited {elapsed:.0f} s for the failure"
    assert ("stage exploded" in msg) if r == 0 else ("rank 0" in msg), msg
    try:
        step()
        raise AssertionError("a broken schedule ran another step")
    except RuntimeError as e:
        assert "unusable" in str(e), e
    sched.close()
    t = torch.ones(1)
    comm.all_reduce(t)  # the pipeline's own communicator is untouched
    assert t.item() == comm.size
    return msg
