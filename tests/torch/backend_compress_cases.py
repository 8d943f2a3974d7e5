"""Rank-side cases of the compression hooks (commlib.torch.hooks, docs/compression.md): TinyGPT
under DDP on a "commlib" group with the compressed all_reduce hook (with and without error
feedback), with commlib's PowerSGD hook (several buckets) and with torch's own PowerSGD hook (one
bucket), against DDP's default hook."""
from __future__ import annotations

import torch

from backend_cases import setup
from commlib.models import gpt

STEPS, ROWS_PER_RANK, SEQ, LR = 24, 2, 16, 0.5


def case_tinygpt_ddp(comm, variant):
    """Returns (global losses per step, residual norms or None, this rank's parameters' bytes,
    (payload bytes this rank sent during training, the buckets the hook saw or None))."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import commlib.torch as ct
    import commlib.torch.hooks as hooks
    setup(comm)
    torch.set_num_threads(1)
    cfg = gpt.GPTConfig()
    # several buckets (their residuals apart), except for PowerSGD: its callbacks issue further
    # all_reduces from the completion thread in completion order, which with several buckets can
    # differ between ranks (a MismatchError, docs/compression.md); one bucket keeps them in step
    # commlib_powersgd_unused: DDP's find_unused_parameters adds its own all_reduce after the last
    # bucket's hook, which must follow the hook's collectives on every rank
    ddp = DDP(gpt.TinyGPT(cfg), bucket_cap_mb=25 if variant == "powersgd" else 0.05,
              find_unused_parameters=variant == "commlib_powersgd_unused")
    state = None
    if variant.startswith("ef_") or variant.startswith("noef_"):
        state = hooks.ErrorFeedbackState(compress=variant.split("_")[1], error_feedback=variant.startswith("ef_"))
        ddp.register_comm_hook(state, hooks.compressed_allreduce_hook)
    elif variant.startswith("commlib_powersgd"):  # several buckets: one issuing thread keeps every rank in step
        state = hooks.PowerSGDState(matrix_approximation_rank=4, start_powerSGD_iter=2)
        ddp.register_comm_hook(state, hooks.powersgd_hook)
    elif variant == "powersgd":  # torch's hook, unchanged, on the commlib group
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        ddp.register_comm_hook(psgd.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                                  start_powerSGD_iter=2, use_error_feedback=True),
                               psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    core = ct.python_group(None).comm._core
    before = core.bytes_sent()
    losses, _ = gpt.train_data_parallel(ddp, opt, comm, gpt.batches(cfg, STEPS, ROWS_PER_RANK * comm.size, SEQ),
                                        ROWS_PER_RANK)
    sent = core.bytes_sent() - before
    buckets = None
    if isinstance(state, hooks.ErrorFeedbackState):
        residuals = [float(e.norm()) for e in state.residuals.values()]
    elif isinstance(state, hooks.PowerSGDState):
        residuals = [float(e.norm()) for lay in state.layouts.values() for e in lay.errors]
        buckets = len(state.layouts)
        state.close()
    else:
        residuals = None
    params = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()]).numpy().tobytes()
    return losses, residuals, params, (sent, buckets)


def refusals(comm):
    """The hook's arguments refused, naming them."""
    import pytest

    import commlib.torch.hooks as hooks
    setup(comm)
    with pytest.raises(ValueError, match="compress"):
        hooks.ErrorFeedbackState(compress=None)
    with pytest.raises(TypeError, match="error_feedback"):
        hooks.ErrorFeedbackState(error_feedback="yes")
    with pytest.raises(TypeError, match="process_group"):
        hooks.ErrorFeedbackState(process_group=object())._group()
    with pytest.raises(ValueError, match="matrix_approximation_rank"):
        hooks.PowerSGDState(matrix_approximation_rank=0)
    with pytest.raises(ValueError, match="start_powerSGD_iter"):
        hooks.PowerSGDState(start_powerSGD_iter=1)
    with pytest.raises(TypeError, match="use_error_feedback"):
        hooks.PowerSGDState(use_error_feedback=1)
    with pytest.raises(TypeError, match="process_group"):
        hooks.PowerSGDState(process_group=object())._comm()
    return True
