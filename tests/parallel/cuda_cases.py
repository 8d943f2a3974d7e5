"""Rank side of test_parallel_cuda.py: commlib.parallel's pipeline schedules and parameter server
on CUDA tensors (every rank on GPU 0: several ranks per GPU), against the one-process CPU
references of pp_cases and dp_cases. Never run so far (no GPU has been lent to this project)."""
from __future__ import annotations

import torch

from parallel import dp_cases, pp_cases, sp_cases, tp_cases

# fp32 training on a GPU rounds differently from the CPU (its matmul and reduction kernels sum in
# another order; TF32 is off): 1e-4 relative after 10 SGD-with-momentum steps, as the torch
# backend's CUDA training tests allow (tests/torch/cuda_cases.py). The pipelines run in float64
# and keep pp_cases.PP_TOL.
PS_CUDA_TOL = 1e-4


def _cuda():
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def pipeline_matrix(comm, cases) -> list:
    """pp_cases.run_case on CUDA stages for every (kind, v, m, n_layers) case."""
    _cuda()
    out = [dict(case=c, **pp_cases.run_case(comm, *c, device="cuda")) for c in cases]
    torch.cuda.synchronize()
    return out


def parameter_server(comm, **kw) -> dict:
    _cuda()
    return dp_cases.train_equivalence(comm, "ps", "mlp", device="cuda", **kw)


def tensor_and_sequence(comm) -> dict:
    """The Megatron MLP (plain and sequence-parallel; tp_cases.mlp checks TP_TOL itself) and
    every attention algorithm in float32 and float64 on CUDA shards: the worst error per
    "dtype.case" (the caller checks them against sp_cases.ATTN_TOL)."""
    _cuda()
    for sp in (False, True):
        tp_cases.mlp(comm, sp, device="cuda")
    worst = {}
    for dt, algos in (("float32", ("ring", "ulysses", "hybrid")), ("float64", ("ring", "ulysses"))):
        for k, v in sp_cases.attention_suite(comm, dt, algos, device="cuda").items():
            worst[f"{dt}.{k}"] = v
    return worst
