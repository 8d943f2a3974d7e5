"""Step timing of the tiny GPT (rank-side function of ``bench/parallel_step.py``)."""
from __future__ import annotations

from typing import Optional

import torch

from commlib.models.gpt import GPTConfig, TinyGPT, batches, make_groups

__all__ = ["measure_step"]


def measure_step(comm, tp_size: int = 1, cp_size: int = 1, cp_mode: str = "ring", layout: str = "contiguous",
                 sequence_parallel: bool = False, ulysses_size: Optional[int] = None, cfg: Optional[dict] = None,
                 batch: int = 2, seq: int = 256, steps: int = 5, warmup: int = 2, threads: int = 1) -> dict:
    """Time training steps of the tiny GPT on this rank (``comm=None``: single process).

    Returns this rank's median step time (forward, backward, gradient sync, SGD), parameter bytes,
    bytes saved for backward (activations, counted once per storage via saved-tensor hooks),
    peak RSS, and the final loss. Rank-side function of ``bench/parallel_step.py``.
    """
    import resource
    import time

    torch.set_num_threads(threads)
    c = GPTConfig(**(cfg or {}))
    groups = make_groups(comm, tp_size, cp_size, ulysses_size) if comm is not None else None
    model = TinyGPT(c, groups, cp_mode=cp_mode, layout=layout, sequence_parallel=sequence_parallel)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens, targets = next(batches(c, 1, batch, seq))
    tok, tgt = model.shard(tokens), model.shard(targets)
    times, saved = [], {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    loss = None
    for i in range(warmup + steps):
        if comm is not None:
            comm.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if i == 0:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = model(tok, tgt)
        else:
            loss = model(tok, tgt)
        loss.backward()
        model.sync_grads()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    times.sort()
    out = {"step_ms": 1e3 * times[len(times) // 2],
           "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
           "saved_bytes": sum(saved.values()),
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
           "loss": model.global_loss(loss)}
    for g in (groups or {}).values():
        if hasattr(g, "close"):
            g.close()
    return out
