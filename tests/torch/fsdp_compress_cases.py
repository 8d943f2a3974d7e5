"""Rank-side cases of FSDP2's compressed collectives (commlib.torch.fsdp_hooks,
docs/compression.md): TinyGPT under ``fully_shard`` on a "commlib" mesh, with FSDP2's own
all-gather / reduce-scatter and with commlib's quantized ones, counting the bytes the group's
communicator sent."""
from __future__ import annotations

import torch

from backend_cases import _mesh, setup
from commlib.models import gpt

STEPS, ROWS_PER_RANK, SEQ, LR = 10, 2, 16, 1e-2
# variant -> (all-gather codec, reduce-scatter codec): int8 both ways, and ZeRO++'s split
# (int8 weights, int4 gradients); every compressed reduce-scatter keeps error feedback.
VARIANTS = {"plain": (None, None), "int8": ("int8", "int8"), "int8_int4": ("int8", "int4")}


def fsdp_param_group(module):
    """`module`'s FSDP2 parameter group, None where it holds no parameters of its own (a root whose
    parameters are all in its fully_shard-ed children: no collective of its own). A private
    attribute: torch 2.13 keeps a list of them, `_fsdp_param_groups`; 2.11, the lent GPU machine's,
    one, `_fsdp_param_group` (session 31's GPU run: None for such a root)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return groups[0] if groups else None
    return state._fsdp_param_group


def case_tinygpt_fsdp(comm, variant):
    """Returns (global losses per step, bytes the mesh group's communicator sent during training,
    the full parameters' bytes, (all-gather calls, reduce-scatter calls, the reduce-scatters'
    error-feedback residual norms) of the compressed comms)."""
    from torch.distributed.fsdp import fully_shard

    import commlib.torch as ct
    import commlib.torch.fsdp_hooks as fsdp_hooks
    st = setup(comm)
    torch.set_num_threads(1)
    mesh = _mesh(st, "commlib", (comm.size,))
    cfg = gpt.GPTConfig(d_model=32, n_layers=2)
    model = gpt.TinyGPT(cfg)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    ag, rs = VARIANTS[variant]
    calls = (0, 0, [])
    if ag or rs:
        changed = fsdp_hooks.compress_fsdp(model, all_gather=ag, reduce_scatter=rs)
    core = ct.python_group(mesh.get_group()).comm._core
    before = core.bytes_sent()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses, _ = gpt.train_data_parallel(model, opt, comm, gpt.batches(cfg, STEPS, ROWS_PER_RANK * comm.size, SEQ),
                                        ROWS_PER_RANK)
    sent = core.bytes_sent() - before
    if ag or rs:
        groups = [g for g in map(fsdp_param_group, changed) if g is not None]
        comms = [(g._all_gather_comm, g._reduce_scatter_comm) for g in groups]
        calls = (sum(a.calls for a, _ in comms), sum(r.calls for _, r in comms),
                 [float(r.residual.norm()) if r.residual is not None else 0.0 for _, r in comms])
    full = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()]).numpy().tobytes()
    return losses, sent, full, calls


def refusals(comm):
    """Bad arguments refused, naming them, before anything is sent."""
    import pytest

    import commlib.torch.fsdp_hooks as fsdp_hooks
    st = setup(comm)
    with pytest.raises(ValueError, match="compress"):
        fsdp_hooks.CompressedAllGather(None)
    with pytest.raises(ValueError, match="compress"):
        fsdp_hooks.CompressedReduceScatter("int9")
    with pytest.raises(TypeError, match="error_feedback"):
        fsdp_hooks.CompressedReduceScatter("int8", error_feedback=1)
    with pytest.raises(ValueError, match="module"):
        fsdp_hooks.compress_fsdp(torch.nn.Linear(2, 2))
    group = _mesh(st, "commlib", (comm.size,)).get_group()
    ints = torch.zeros(4 * comm.size, dtype=torch.int32)
    with pytest.raises(ValueError, match="compress"):  # FSDP2 gathers bytes for mixed dtypes
        fsdp_hooks.CompressedAllGather("int8")(ints, ints[:4], group)
    x = torch.zeros(4 * comm.size)
    with pytest.raises(ValueError, match="op"):
        fsdp_hooks.CompressedReduceScatter("int8")(x[:4], x, group, op=torch.distributed.ReduceOp.MAX)
    with pytest.raises(TypeError, match="group"):
        fsdp_hooks.CompressedAllGather("int8")(x, x[:4], st["gloo"])
    return True
