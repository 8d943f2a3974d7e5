"""Rank-side function of bench/pipeline_bench.py (importable by the rank pool's workers)."""
from __future__ import annotations

import time

import torch
from torch import nn

from commlib.parallel import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                              ScheduleZeroBubble)
from commlib.parallel.pipeline import actions as A
from commlib.parallel.pipeline.timeline import bubble_fraction, gather_timeline

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B,
             "zero_bubble": ScheduleZeroBubble}


def mlp(n_layers: int, width: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(*[m for _ in range(n_layers) for m in (nn.Linear(width, width), nn.GELU())])


def loss_fn(out, target):
    return ((out - target) ** 2).mean()


def run_schedule(comm, kind: str, v: int, m: int, layers: int, width: int, batch: int, steps: int, warmup: int):
    """Median step time, measured bubble (median over steps), activation memory and the median
    step's timeline of one schedule on this pipeline of comm.size ranks."""
    torch.set_num_threads(1)
    P = comm.size
    S = P * v
    per = layers // S
    stages = [PipelineStage(mlp(per, width, seed=s), s, S, comm) for s in range(comm.rank, S, P)]
    sched = SCHEDULES[kind](stages if v > 1 else stages[0], n_microbatches=m, loss_fn=loss_fn)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
    first, last = comm.rank == 0, (S - 1) % P == comm.rank
    times, bubbles, timelines = [], [], []
    for i in range(warmup + steps):
        comm.barrier()
        t0 = time.perf_counter()
        sched.step(*([x] if first else []), **({"target": y} if last else {}))
        for st in stages:
            st.module.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        ev = gather_timeline(sched)
        if i >= warmup:
            times.append(dt)
            bubbles.append(bubble_fraction(ev, P))
            timelines.append(ev)
    mid = sorted(range(steps), key=lambda i: times[i])[steps // 2]
    orders = A.build_orders(kind, S, P, m)
    stats = dict(sched.stats)
    sched.close()
    return {"step_ms": 1e3 * sorted(times)[steps // 2], "bubble": sorted(bubbles)[steps // 2],
            "theory": A.theory_bubble(kind, S, P, m), "order_bubble": A.order_bubble(kind, S, P, m),
            "peak_act_bytes": stats["peak_activation_bytes"],
            "per_mb_bytes": stats["activation_bytes_per_microbatch"],
            "peak_in_flight": stats["peak_in_flight"], "theory_in_flight": A.peak_in_flight(orders)[comm.rank],
            "timeline": timelines[mid]}


def single_process(layers: int, width: int, batch: int, steps: int, warmup: int) -> float:
    """Median step time of the whole model in one process (the reference the pipeline divides)."""
    torch.set_num_threads(1)
    model = mlp(layers, width, seed=0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss_fn(model(x), y).backward()
        model.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return 1e3 * sorted(times)[steps // 2]
