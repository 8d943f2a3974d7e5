"""Rank side of test_torch_native_calls.py's asynchronous calls whose inputs the caller drops at once
(staging.h StagedCall::inputs: the C++ backend holds them until the call ran)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from backend_cases import _cmp, setup
from native_call_cases import handed_over


def case_async_inputs_dropped(comm):
    """Asynchronous collectives whose input the caller drops at once (a temporary, as in
    ``dist.reduce_scatter_tensor(out, torch.cat(...), async_op=True)``), the freed memory written over
    before the wait: the backend holds each input until its call ran (staging.h StagedCall::inputs;
    without it, reduce_scatter_tensor and all_gather_into_tensor read the junk, seen at 2 ranks in 46-50
    calls of 50). Exact values, 20 rounds of four calls, float32 and int64, nothing handed over."""
    setup(comm)
    P, r = comm.size, comm.rank

    def mine(n, dt, q=None):  # rank q's input of n elements
        return (torch.arange(n) + 1000 * (r if q is None else q)).to(dt)
    with handed_over() as seen:
        for round_ in range(20):
            for dt in (torch.float32, torch.int64):
                n = 4 * P + round_ % 3 * P
                rs = torch.zeros(n // P, dtype=dt)
                ag = torch.zeros(n * P, dtype=dt)
                a2a = torch.zeros(n, dtype=dt)
                lst = [torch.zeros(n, dtype=dt) for _ in range(P)]
                works = [dist.reduce_scatter_tensor(rs, mine(n, dt), async_op=True),
                         dist.all_gather_into_tensor(ag, mine(n, dt), async_op=True),
                         dist.all_to_all_single(a2a, mine(n, dt), async_op=True),
                         dist.all_gather(lst, mine(n, dt), async_op=True)]
                junk = [torch.full((n * P,), -7, dtype=dt) for _ in range(16)]  # (reuses the freed inputs)
                for w in works:
                    w.wait()
                del junk
                every = [mine(n, dt, q) for q in range(P)]
                b = n // P
                _cmp(f"reduce_scatter_tensor {dt} round {round_}", rs, sum(every)[r * b:(r + 1) * b], exact=True)
                _cmp(f"all_gather_into_tensor {dt} round {round_}", ag, torch.cat(every), exact=True)
                _cmp(f"all_to_all_single {dt} round {round_}", a2a,
                     torch.cat([e[r * b:(r + 1) * b] for e in every]), exact=True)
                for q in range(P):
                    _cmp(f"all_gather {dt} round {round_} from {q}", lst[q], every[q], exact=True)
    assert seen == [], ("handed over", seen)
    return True
