"""Moving flat-sharded state to a larger world in memory: what ``ZeroOptimizer.grow`` and
``FullyShardedModule.grow`` do on the members and their ``joined`` on each joiner, the in-memory
counterpart of ``zero_checkpoint.py``'s load at another world size.

Layout (zero_checkpoint.py): a unit of ``numel`` elements has ``piece = ceil(numel / P)`` and
rank r owns ``[r*piece, (r+1)*piece)`` of it, clipped to ``numel`` (the rest of the last pieces
is zero padding). A grow keeps the members' ranks 0..P-1 and numbers the joiners after them
(docs/fault_tolerance.md, "Growing back"), so the old owner of an element is the rank of the
grown communicator with its old number: one ``all_to_all`` with splits per tensor moves every
element from its old owner to its new one. Only the overlaps of old and new pieces travel (no
rank ever holds a whole unit), and bytes are copied, never summed: the move is exact, so the
result equals a load of a sharded checkpoint at the grown size bit for bit.

What moves, per unit: the parameter shard (FSDP: the shard is the only copy; ZeRO-1/2 hold the
full parameters on every rank and broadcast them instead), the gradient shard when the wrapper
keeps one (ZeRO-2, FSDP), and every elementwise optimizer-state tensor (the shape of the shard:
momentum, Adam's exp_avg and exp_avg_sq). Scalars (Adam's step) and the param groups'
hyperparameters are rank 0's, sent in the description (``describe``) that goes first.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from ._state_transfer import broadcast_object


def piece_of(numel: int, world: int) -> int:
    """The per-rank piece of a unit of ``numel`` elements over ``world`` ranks (FlatLayout's)."""
    return -(-numel // world) if numel else 0


def _span(rank: int, numel: int, world: int):
    """The elements ``[lo, hi)`` rank ``rank`` owns over ``world`` ranks (empty past the world)."""
    if rank >= world:
        return 0, 0
    piece = piece_of(numel, world)
    return min(numel, rank * piece), min(numel, (rank + 1) * piece)


def _overlap(a, b):
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


def move_splits(numel: int, old_world: int, new_world: int, rank: int):
    """(input_splits, output_splits) of rank ``rank`` of the grown communicator (``new_world``
    ranks) moving a unit of ``numel`` elements from its ``old_world`` owners to its new ones: what
    its old piece sends to each rank, what its new piece receives from each."""
    mine_old, mine_new = _span(rank, numel, old_world), _span(rank, numel, new_world)
    ins = [_overlap(mine_old, _span(j, numel, new_world)) for j in range(new_world)]
    outs = [_overlap(mine_new, _span(i, numel, old_world)) for i in range(new_world)]
    return ins, outs


def move_piece(comm, old: Optional[torch.Tensor], numel: int, old_world: int, dtype, device) -> torch.Tensor:
    """This rank's new piece (``piece_of(numel, comm.size)`` elements, zero padded) of a tensor
    whose old pieces lived on ranks 0..old_world-1 of ``comm``: ``old`` is this rank's old piece
    (None on a joiner; on a member that has none, zeros are sent). Collective over ``comm``."""
    ins, outs = move_splits(numel, old_world, comm.size, comm.rank)
    new = torch.zeros(piece_of(numel, comm.size), dtype=dtype, device=device)
    if old is None:
        src = torch.zeros(sum(ins), dtype=dtype, device=device)
    else:
        src = old.detach().reshape(-1)[:sum(ins)].to(dtype).contiguous()
    comm.all_to_all(new[:sum(outs)], src, input_splits=ins, output_splits=outs)
    return new


class OldShard:
    """What a member held for one unit before the grow: its piece of the parameters, of the
    gradient and of the optimizer state (captured before the unit is laid out again)."""

    def __init__(self, shard: torch.Tensor, optimizer):
        self.param = shard.detach()
        self.grad = None if shard.grad is None else shard.grad.detach()
        self.state = dict(optimizer.state.get(shard, {})) if optimizer is not None else {}


def layout_of(units) -> list:
    """What every rank's units must agree on before anything moves: their names and sizes."""
    return [(u.name, u.layout.numel) for u in units]


def describe(old_world: int, olds: Sequence[OldShard], optimizer, move_grads: bool, layout: list) -> dict:
    """Rank 0's description of its sharded state before the grow (sent to every rank first): the
    old world size, its units (``layout_of``), per unit whether it has a gradient and each
    optimizer-state entry, elementwise (the shard's shape: moved piece by piece) or a value (sent
    as is), and the param groups' hyperparameters."""
    units = []
    for o in olds:
        state = {}
        for k, v in o.state.items():
            if isinstance(v, torch.Tensor) and v.shape == o.param.shape:
                state[k] = ("piece", str(v.dtype).replace("torch.", ""))
            elif isinstance(v, torch.Tensor):  # kept where it was (Adam's step: on the CPU unless capturable)
                state[k] = ("device_value" if v.device.type != "cpu" else "value", v.detach().cpu())
            else:
                state[k] = ("value", v)
        units.append({"grad": bool(move_grads and o.grad is not None), "state": state})
    groups = None if optimizer is None else [{k: v for k, v in g.items() if k != "params"}
                                             for g in optimizer.param_groups]
    return {"old_world": old_world, "layout": layout, "units": units, "groups": groups}


def send_description(comm, old_world: int, olds: Optional[Sequence[OldShard]], optimizer,
                     move_grads: bool, units) -> dict:
    """``describe`` on rank 0 (a member), received by every rank (members and joiners alike),
    which then agree that their units are rank 0's: a joiner built with other arguments (another
    ``bucket_cap_mb`` or ``wrap``) has other units, and every rank raises ValueError before any
    piece moves rather than exchanging pieces that do not fit."""
    description = broadcast_object(comm, describe(old_world, olds, optimizer, move_grads, layout_of(units))
                                   if comm.rank == 0 else None)
    mine = layout_of(units)
    same = torch.tensor([int([tuple(x) for x in description["layout"]] == mine)], dtype=torch.int32)
    comm.all_reduce(same, op="min")
    if not int(same.item()):
        raise ValueError("the ranks' sharded units differ (rank 0's: " +
                         ", ".join(f"{n} of {k}" for n, k in description["layout"]) + "; this rank's: " +
                         ", ".join(f"{n} of {k}" for n, k in mine) + "): build the joiners' wrapper with the "
                         "members' arguments (bucket_cap_mb, wrap, ...)")
    return description


def move_units(comm, units, olds: Optional[List[OldShard]], description: dict, optimizer,
               move_params: bool) -> Optional[str]:
    """Fill every unit's shard (laid out for ``comm`` already), its gradient and ``optimizer``'s
    state over it with the pieces that lived on the old owners (``olds``: this member's, None on
    a joiner). Collective over ``comm``; every rank runs the same calls whatever it holds, so a
    rank that lacks something still moves the rest. Returns what this rank could not take (a
    joiner without an optimizer while the members sent state, other param groups), for the caller
    to raise once the collectives are over."""
    old_world = description["old_world"]
    problem = None
    for i, (u, entry) in enumerate(zip(units, description["units"])):
        s, numel = u.shard, u.layout.numel
        o = olds[i] if olds is not None else None
        with torch.no_grad():
            if move_params:
                s.data.copy_(move_piece(comm, None if o is None else o.param, numel, old_world, s.dtype, s.device))
            s.grad = move_piece(comm, None if o is None else o.grad, numel, old_world, s.dtype, s.device) \
                if entry["grad"] else None
            state = {}
            for k, (kind, v) in entry["state"].items():
                if kind == "piece":
                    old = None if o is None else o.state.get(k)
                    state[k] = move_piece(comm, old, numel, old_world, getattr(torch, v), s.device)
                    if o is not None:
                        o.state.pop(k, None)  # the old piece can go now
                elif kind == "device_value":
                    state[k] = v.to(s.device)
                else:
                    state[k] = v.clone() if isinstance(v, torch.Tensor) else v
        if optimizer is not None:
            optimizer.state.pop(s, None)
            if state:
                optimizer.state[s] = state
        elif state:
            problem = ("optimizer: the members sent optimizer state but this rank has no optimizer to take it "
                       "(pass one, built as the members built theirs)")
    groups = description["groups"]
    if optimizer is not None and groups is not None:
        if len(groups) != len(optimizer.param_groups):
            return (f"optimizer: rank 0's has {len(groups)} param groups, this rank's "
                    f"{len(optimizer.param_groups)}")
        for g, saved in zip(optimizer.param_groups, groups):
            g.update(saved)
    elif optimizer is not None and comm.rank != 0:
        problem = problem or "optimizer: rank 0 passed none, so there is no state to receive"
    return problem
