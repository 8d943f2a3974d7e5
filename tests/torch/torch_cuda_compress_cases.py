"""Rank side of test_cuda_backend.py's compressed cases: the DDP hook (commlib.torch.hooks),
commlib.parallel.DataParallel(compress=, error_feedback=) and FSDP2 with commlib's compressed
all-gather / reduce-scatter (commlib.torch.fsdp_hooks) on a CUDA model, their collectives the
stream engine's compressed ones after the device's error feedback (docs/compression.md "On device
buffers"), each against the same on the same model on the CPU (the host engine). Returns lists of
failures (empty: all good). Losses within 2% of the CPU run: the GPU's matmuls round differently,
and a value near a grid point may code one step apart."""
from __future__ import annotations

import torch

import commlib.torch.hooks as hooks
from fsdp_compress_cases import fsdp_param_group
from torch_cuda_cases import _cuda_setup, _fsdp2_trained, _mlp, _train


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


def _identical_on_every_rank(comm, flat):
    """Whether every rank holds ``flat`` (a CPU tensor) bit for bit."""
    every = torch.zeros(comm.size * flat.numel(), dtype=flat.dtype)
    comm.all_gather(every, flat)
    return all(torch.equal(b, every[:flat.numel()]) for b in every.split(flat.numel()))


def case_cuda_data_parallel_compressed(comm, steps=6, per_rank=4):
    """DataParallel with int8 and error feedback (small buckets: several per step) on a CUDA model
    and on the CPU: parameters identical on every rank, residuals kept, losses within 2%."""
    from commlib.parallel import DataParallel
    _cuda_setup(comm)
    runs, failures = {}, []
    for device in ("cuda", "cpu"):
        model = _mlp(0).to(device)
        dp = DataParallel(model, comm, bucket_cap_mb=0.0005, compress="int8", error_feedback=True)
        opt = torch.optim.SGD(dp.parameters(), lr=0.1)
        runs[device] = _train(dp, opt, device, comm.rank, steps, per_rank)
        flat = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
        if not _identical_on_every_rank(comm, flat):
            failures.append(f"DataParallel compressed on {device}: the ranks' parameters differ")
        if len(dp._residuals) < 2 or not any(r.abs().sum().item() > 0 for r in dp._residuals.values()):
            failures.append(f"DataParallel compressed on {device}: {len(dp._residuals)} residuals, all zero")
        if device == "cuda" and not all(r.is_cuda for r in dp._residuals.values()):
            failures.append("DataParallel compressed on cuda: a residual left the GPU")
    if not torch.allclose(runs["cuda"], runs["cpu"], rtol=0.02, atol=1e-4):
        failures.append(f"DataParallel compressed losses: cuda {runs['cuda'].tolist()} vs cpu {runs['cpu'].tolist()}")
    return failures


def case_cuda_fsdp2_compressed(comm, steps=6):
    """FSDP2 on a commlib mesh with commlib's int8 all-gather and int8 reduce-scatter with error
    feedback (compress_fsdp), on CUDA and on the CPU: the compressed collectives ran (calls counted)
    and kept residuals, the full parameters are identical on every rank, losses within 2%."""
    from torch.distributed.device_mesh import init_device_mesh

    import commlib.torch.fsdp_hooks as fsdp_hooks
    _cuda_setup(comm)
    runs, failures = {}, []
    for device in ("cuda", "cpu"):
        mesh = init_device_mesh(device, (comm.size,), mesh_dim_names=("dp",))
        model, runs[device], changed = _fsdp2_trained(
            mesh, device, comm.rank, steps,
            lambda m: fsdp_hooks.compress_fsdp(m, all_gather="int8", reduce_scatter="int8"))
        groups = [g for g in map(fsdp_param_group, changed) if g is not None]
        gathers = [g._all_gather_comm for g in groups]
        scatters = [g._reduce_scatter_comm for g in groups]
        if not all(a.calls for a in gathers) or not all(r.calls for r in scatters):
            failures.append(f"FSDP2 compressed on {device}: calls {[a.calls for a in gathers]}, "
                            f"{[r.calls for r in scatters]}")
        if not any(r.residual is not None and float(r.residual.abs().sum()) > 0 for r in scatters):
            failures.append(f"FSDP2 compressed on {device}: error feedback kept no residual")
        full = torch.cat([p.full_tensor().detach().cpu().reshape(-1) for p in model.parameters()])
        if not _identical_on_every_rank(comm, full):
            failures.append(f"FSDP2 compressed on {device}: the ranks' full parameters differ")
    if not torch.allclose(runs["cuda"], runs["cpu"], rtol=0.02, atol=1e-4):
        failures.append(f"FSDP2 compressed losses: cuda {runs['cuda'].tolist()} vs cpu {runs['cpu'].tolist()}")
    return failures
