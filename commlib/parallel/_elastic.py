"""Grow and shrink of the sharded wrappers (``ZeroOptimizer``, ``FullyShardedModule``),
docs/fault_tolerance.md "commlib.parallel".

A wrapper passed here has ``comm``, ``_units`` (each with ``shard`` and ``layout``),
``_in_backward``, ``_drop_failed_step()`` (forget what a step that raised left in flight),
``_relayout(comm)`` (lay every unit out for ``comm``'s size and rank, and make
it the wrapper's communicator) and ``_agree(comm)`` (the collectives its constructor runs before
the state moves: a joiner's constructor meets the members' grow there).

- Grow: the shards move from the members to the grown layout in memory (``_reshard.py``); the
  members keep their ranks, so no shard is lost.
- Shrink: the dead ranks' shards had no replica (each rank's piece lives on that rank only), so
  nothing can be moved: the survivors lay the units out for the smaller size and load a sharded
  checkpoint, which is re-sharded as it loads. Without a checkpoint, shrink refuses before
  anything is sent.
"""
from __future__ import annotations

from typing import Optional

from ._reshard import OldShard, move_units, send_description
from .zero_checkpoint import read_checkpoint_meta


def _between_steps(wrapper, what: str):
    if wrapper._in_backward:
        raise RuntimeError(f"{what}: a backward is in flight; call it between steps")


def grow(wrapper, n: Optional[int], timeout: Optional[float], optimizer, close_old: bool,
         move_params: bool, move_grads: bool):
    """The members' side: ``comm.grow``, then every unit laid out for the grown size and its
    shards moved (see the module docstring). Returns the grown communicator. An error from the
    grow itself leaves the wrapper as it was; one while the state moves (a rank died) leaves it on
    the grown communicator with its state partly moved: shrink it from a checkpoint."""
    _between_steps(wrapper, "grow")
    old = wrapper.comm
    new = old.grow(n, timeout)
    olds = [OldShard(u.shard, optimizer) for u in wrapper._units]
    for u in wrapper._units:
        u.shard.grad = None  # the old piece's; the moved one replaces it
    wrapper._relayout(new)
    if close_old:
        old.close()
    wrapper._agree(new)
    _move(new, wrapper, olds, optimizer, old.size, move_params, move_grads)
    return new


def joined(wrapper, optimizer, move_params: bool, move_grads: bool):
    """A joiner's side, once its wrapper is built over the grown communicator (its constructor
    ran ``_agree``): receive its pieces of the shards, gradients and optimizer state."""
    _move(wrapper.comm, wrapper, None, optimizer, None, move_params, move_grads)


def _move(comm, wrapper, olds, optimizer, old_world, move_params, move_grads):
    description = send_description(comm, old_world, olds, optimizer, move_grads, wrapper._units)
    problem = move_units(comm, wrapper._units, olds, description, optimizer, move_params)
    if problem is not None:  # raised once every rank is through the collectives
        raise ValueError(problem)


def shrink(wrapper, exclude, checkpoint, close_old: bool, load):
    """The survivors' side of a shrink: refuse without ``checkpoint`` (nothing was sent yet),
    else ``comm.shrink``, every unit laid out for the smaller size and ``load(checkpoint)``."""
    name = type(wrapper).__name__
    if checkpoint is None:
        raise ValueError(f"checkpoint: {name}.shrink needs a sharded checkpoint (save_sharded_checkpoint's "
                         "directory): each rank's shard of the optimizer state"
                         f"{' and of the parameters' if name == 'FullyShardedModule' else ''} lived on that rank "
                         "only, so the dead ranks' shards are gone and cannot be moved; the survivors reload "
                         "the checkpoint at the new size (the steps since it are lost)")
    read_checkpoint_meta(checkpoint)  # a missing or foreign checkpoint raises here, on every rank alike
    old = wrapper.comm
    new = old.shrink(exclude)
    wrapper._drop_failed_step()
    for u in wrapper._units:
        u.shard.grad = None
    wrapper._relayout(new)
    if close_old:
        old.close()
    load(checkpoint)
    return new
