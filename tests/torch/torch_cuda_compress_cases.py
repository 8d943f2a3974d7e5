"""Rank side of test_cuda_backend.py's compressed cases: the DDP hook (commlib.torch.hooks) on a
CUDA model, its buckets averaged by the stream engine's compressed all_reduce after the device's
error feedback (docs/compression.md "On device buffers"), against the same hook on the same model
on the CPU (the host engine). Returns lists of failures (empty: all good)."""
from __future__ import annotations

import torch

import commlib.torch.hooks as hooks
from torch_cuda_cases import _cuda_setup, _mlp, _train


def case_cuda_ddp_compressed(comm, steps=6, per_rank=4):
    """int8 with error feedback: every rank ends with the same parameters bit for bit, the
    residuals are non-zero, and the losses track the CPU run of the same hook within 2% (the GPU's
    matmuls round differently, and a value near a grid point may code one step apart)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    _cuda_setup(comm)
    runs, failures = {}, []
    for device in ("cuda", "cpu"):
        model = _mlp(0).to(device)
        ddp = DDP(model, device_ids=[0] if device == "cuda" else None)
        state = hooks.ErrorFeedbackState(compress="int8")
        ddp.register_comm_hook(state, hooks.compressed_allreduce_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        losses = _train(ddp, opt, device, comm.rank, steps, per_rank)
        flat = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
        every = torch.zeros(comm.size * flat.numel())
        comm.all_gather(every, flat)
        if not all(torch.equal(b, every[:flat.numel()]) for b in every.split(flat.numel())):
            failures.append(f"DDP compressed on {device}: the ranks' parameters differ")
        if not any(r.abs().sum().item() > 0 for r in state.residuals.values()):
            failures.append(f"DDP compressed on {device}: error feedback kept no residual")
        runs[device] = losses
    if not torch.allclose(runs["cuda"], runs["cpu"], rtol=0.02, atol=1e-4):
        failures.append(f"DDP compressed losses: cuda {runs['cuda'].tolist()} vs cpu {runs['cpu'].tolist()}")
    return failures
