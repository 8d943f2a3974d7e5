"""ZeRO: sharded optimizer state (stage 1) and sharded gradients (stage 2) around any torch
optimizer. Stage 3 (sharded parameters) is :class:`FullyShardedModule` in ``fully_sharded.py``;
the sharded checkpoints both write are in ``zero_checkpoint.py`` (with the flat-unit layout).

Optimizer state is elementwise for the usual optimizers (SGD momentum, Adam moments), so each rank
runs a real torch optimizer over its pieces only.

Memory per rank with Adam, Ψ parameters, P ranks (fp32 training; the mixed-precision formulas of
the ZeRO paper replace the first 4Ψ+4Ψ by 2Ψ+2Ψ and add a 4Ψ fp32 master copy to the sharded part):

====================  ==========================  ==================================
DataParallel          4Ψ + 4Ψ + 8Ψ = 16Ψ          params, grads, Adam m and v
ZeroOptimizer stage 1 4Ψ + 4Ψ + 8Ψ/P              grads full, optimizer state sharded
ZeroOptimizer stage 2 4Ψ + 4Ψ/P + 8Ψ/P            grads reduce-scattered from backward hooks
FullyShardedModule    16Ψ/P (+ one gathered unit) params, grads and state sharded
====================  ==========================  ==================================
"""
from __future__ import annotations

from typing import Callable, List, Optional

import torch

from ._buckets import (MB, FlatLayout, OrderedLauncher, broadcast_tensors, check_algorithm, check_comm,
                       check_one_device, check_positive, check_same_structure, dtype_buckets,
                       optimizer_state_tensors, param_slots, queue_backward_callback, storage_bytes)
from . import _elastic
from .zero_checkpoint import _load_sharded, _save_sharded, _Unit, read_checkpoint_meta

__all__ = ["ZeroOptimizer", "FullyShardedModule", "read_checkpoint_meta"]


class _ZeroUnit(_Unit):
    def __init__(self, name, params, rank, world, dtype):
        layout = FlatLayout([name + f".{i}" for i in range(len(params))], [p.shape for p in params],
                            world)
        super().__init__(name, layout, rank)
        self.params = params
        self.flat = torch.zeros(layout.padded, dtype=dtype, device=params[0].device)
        with torch.no_grad():
            for p, v in zip(params, layout.views(self.flat)):
                v.copy_(p.detach())
                p.data = v                  # the model's parameters now live in the flat buffer
        self.shard = torch.nn.Parameter(self.flat[layout.piece * rank:layout.piece * (rank + 1)])
        self.flat_grad = None               # stage 1: persistent flat gradient
        self.tmp_grad = None                # stage 2: bucket being filled during backward
        self.ready = 0
        self.work = None
        self.out = None

    def relayout(self, world: int, rank: int):
        """Lay the unit out for ``world`` ranks (a grow or a shrink): a new flat buffer of the new
        padded size holding the same parameter values (this rank's: ZeRO-1/2 keep the whole
        parameters on every rank), the parameters and the shard (the same objects, so the
        optimizer's references hold) pointed into it, and stage 1's flat gradient with this
        rank's local gradients."""
        layout = FlatLayout(self.layout.names, self.layout.shapes, world)
        n = layout.numel

        def moved(old):
            new = torch.zeros(layout.padded, dtype=old.dtype, device=old.device)
            new[:n].copy_(old[:n])
            return new
        with torch.no_grad():
            self.flat = moved(self.flat)
            for p, v in zip(self.params, layout.views(self.flat)):
                p.data = v
            self.shard.data = self.flat[layout.piece * rank:layout.piece * (rank + 1)]
            if self.flat_grad is not None:
                self.flat_grad = moved(self.flat_grad)
                for p, v in zip(self.params, layout.views(self.flat_grad)):
                    p.grad = v
        self.set_layout(layout, rank)


class ZeroOptimizer:
    """ZeRO stage 1 or 2 around any torch optimizer, for a plain (unwrapped) model.

    ``ZeroOptimizer(torch.optim.AdamW, model.parameters(), comm, stage=1, lr=1e-3)``

    The parameters (or param-group dicts) are packed into flat buckets of about ``bucket_cap_mb``
    (reverse parameter order); each rank owns one evenly sized piece of every bucket and runs
    ``optimizer_class`` over its pieces only, so optimizer state is sharded ``1/P``.

    * stage 1: gradients stay full (in a flat buffer ``param.grad`` points into); ``step()``
      reduce-scatters (averages) every bucket into the owned pieces, steps, and all-gathers the
      updated parameters. After ``step()`` the owned block of the flat gradient holds the averaged
      gradient and the other blocks the local one: call ``zero_grad()`` before the next backward.
    * stage 2: post-accumulate-grad hooks copy each gradient into its bucket and free it; a full
      bucket is reduce-scattered asynchronously while backward continues; the end of backward waits
      and accumulates the owned piece. Only the ``1/P`` gradient piece persists.

    Parameters are checked to agree across ranks and broadcast from rank 0 at construction. The
    optimizer synchronises gradients itself: do not also wrap the model in DataParallel.
    Parameters with ``requires_grad=False`` are left alone. Note: a parameter that gets no
    gradient in a step is treated as having a zero gradient (its piece of the bucket is zero).
    The inner torch optimizer is ``.optimizer`` (attach learning-rate schedulers to it);
    ``algorithm`` is used for both the reduce_scatter and the all_gather calls. Replacements join
    with :meth:`grow`/:meth:`joined` (the state moves to the grown layout); after a death,
    :meth:`shrink` reloads a sharded checkpoint (docs/fault_tolerance.md).
    """

    def __init__(self, optimizer_class, params, comm, stage: int = 1, bucket_cap_mb: float = 25.0,
                 algorithm: str = "auto", **optimizer_kwargs):
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_class: expected a torch.optim.Optimizer subclass, got "
                            f"{optimizer_class!r}")
        check_comm(comm)
        if stage not in (1, 2):
            raise ValueError(f"stage: ZeroOptimizer implements stages 1 and 2, got {stage!r} "
                             "(stage 3 is FullyShardedModule)")
        cap = check_positive(bucket_cap_mb, "bucket_cap_mb")
        self.algorithm = algorithm
        check_algorithm("reduce_scatter", algorithm)
        check_algorithm("all_gather", algorithm)
        self.comm, self.stage = comm, stage
        groups = list(params)
        if not groups:
            raise ValueError("params: empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self._units: List[_ZeroUnit] = []
        inner_groups, specs, all_params = [], [], []
        device = None  # every parameter on one device (CPU or CUDA)
        for gi, g in enumerate(groups):
            ps = list(g["params"]) if not isinstance(g["params"], torch.Tensor) else [g["params"]]
            for i, p in enumerate(ps):
                if not isinstance(p, torch.Tensor):
                    raise TypeError(f"params: group {gi} item {i} is a {type(p).__name__}, "
                                    "not a tensor")
            device = check_one_device([(f"group{gi}.param{i}", p) for i, p in enumerate(ps)], "parameter",
                                      device)
            specs += [(f"group{gi}.param{i}", tuple(p.shape), str(p.dtype)) for i, p in enumerate(ps)]
            all_params += ps
            ps = [p for p in ps if p.requires_grad]
            opts = {k: v for k, v in g.items() if k != "params"}
            shards, per_dtype = [], {}
            for dtype, bps in dtype_buckets(list(reversed(ps)), int(cap * MB), int(cap * MB)):
                bi = per_dtype[dtype] = per_dtype.get(dtype, -1) + 1  # bucket number within its dtype
                u = _ZeroUnit(f"g{gi}.{str(dtype).replace('torch.', '')}.b{bi}", bps, comm.rank, comm.size, dtype)
                self._units.append(u)
                shards.append(u.shard)
            inner_groups.append({"params": shards, **opts})
        if not self._units:
            raise ValueError("params: no parameter requires grad")
        # the buckets too: ranks (a grow's joiner) built with another bucket_cap_mb would exchange
        # pieces that do not fit; check_same_structure names the first bucket that differs
        self._specs = specs + [(f"bucket {u.name} (from bucket_cap_mb)", (u.layout.numel,), str(u.flat.dtype))
                               for u in self._units]
        self._frozen = [p for p in all_params if not p.requires_grad]
        self._agree(comm)
        self.optimizer = optimizer_class(inner_groups, **optimizer_kwargs)
        self._where = param_slots(self._units)
        self._hooks = []
        self._in_backward = False
        self._launcher = OrderedLauncher(self._units, self._launch)
        self._marked = set()
        if stage == 1:
            for u in self._units:
                u.flat_grad = torch.zeros(u.layout.padded, dtype=u.flat.dtype, device=u.flat.device)
                for p, v in zip(u.params, u.layout.views(u.flat_grad)):
                    p.grad = v
        else:
            for u in self._units:
                for p in u.params:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        self.last_backward_stats: dict = {}

    def _agree(self, comm):
        """Every rank has the same parameters (names, shapes, dtypes), then rank 0's values (the
        flat buffers hold the parameters now): the constructor's, and a grow's on the members."""
        check_same_structure(comm, self._specs, "parameter")
        broadcast_tensors(comm, [u.flat for u in self._units] + [p.data for p in self._frozen])

    # -- optimizer-like API ---------------------------------------------------------------------
    @property
    def param_groups(self):
        """The inner (sharded) optimizer's param groups: change ``lr`` here."""
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True):
        """Clear gradients (stage 1 zeroes the flat buffer in place; pieces are dropped)."""
        for u in self._units:
            if self.stage == 1:
                u.flat_grad.zero_()
                for p, v in zip(u.params, u.layout.views(u.flat_grad)):
                    p.grad = v
            u.shard.grad = None

    @torch.no_grad()
    def step(self, closure: Optional[Callable] = None):
        """Synchronise gradients (stage 1), step the owned pieces, all-gather the parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.stage == 1:
            works = []
            for u in self._units:
                for p, v in zip(u.params, u.layout.views(u.flat_grad)):
                    if p.grad is None:
                        v.zero_()
                    elif p.grad.data_ptr() != v.data_ptr():
                        v.copy_(p.grad)
                    p.grad = v
                out = torch.empty(u.layout.piece, dtype=u.flat.dtype, device=u.flat.device)
                works.append((u, out, self.comm.reduce_scatter(out, u.flat_grad, op="avg",
                                                               algorithm=self.algorithm,
                                                               async_op=True)))
            for u, out, w in works:
                w.wait()
                # The averaged piece replaces this rank's block of the flat gradient (no extra
                # persistent buffer); the other blocks keep the local gradients until zero_grad.
                own = u.flat_grad[u.layout.piece * self.comm.rank:
                                  u.layout.piece * (self.comm.rank + 1)]
                own.copy_(out)
                u.shard.grad = own
        self.optimizer.step()
        works = [self.comm.all_gather(u.flat, u.shard.detach(), algorithm=self.algorithm,
                                      async_op=True) for u in self._units]
        for w in works:
            w.wait()
        return loss

    def state_dict(self) -> dict:
        """This rank's sharded state: the inner optimizer's state over the owned pieces plus the
        layout. Reload with :meth:`load_state_dict` on the same world size; use
        :meth:`save_sharded_checkpoint` to change world size."""
        return {"zero": {"stage": self.stage, "world": self.comm.size, "rank": self.comm.rank,
                         "units": {u.name: u.layout.meta() for u in self._units}},
                "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict):
        z = state.get("zero", {})
        if z.get("world") != self.comm.size or z.get("rank") != self.comm.rank:
            raise ValueError(f"state: saved by rank {z.get('rank')} of {z.get('world')}, this is "
                             f"rank {self.comm.rank} of {self.comm.size} (use "
                             "load_sharded_checkpoint to reshard)")
        if z.get("units") != {u.name: u.layout.meta() for u in self._units}:
            raise ValueError("state: parameter layout differs from this optimizer's")
        self.optimizer.load_state_dict(state["optimizer"])

    def save_sharded_checkpoint(self, path: str):
        """Write parameters and optimizer state as per-rank pieces plus meta.json (collective)."""
        _save_sharded(path, self.comm, "ZeroOptimizer", self._units, [u.shard for u in self._units],
                      self.optimizer, extra={"stage": self.stage})

    def load_sharded_checkpoint(self, path: str):
        """Load a checkpoint saved on any world size (collective); parameters are re-gathered."""
        _load_sharded(path, self.comm, "ZeroOptimizer", self._units, [u.shard for u in self._units],
                      self.optimizer)
        works = [self.comm.all_gather(u.flat, u.shard.detach(), async_op=True) for u in self._units]
        for w in works:
            w.wait()

    # -- growing and shrinking (docs/fault_tolerance.md, "commlib.parallel") -----------------------
    def grow(self, n: Optional[int] = None, timeout: Optional[float] = None, close_old: bool = True):
        """Take replacement processes in: ``self.comm.grow(n, timeout)`` (every member calls this,
        between steps), then every bucket laid out for the grown size (piece ``ceil(numel/P')``,
        as a ZeroOptimizer built at that size), the parameters broadcast from rank 0 and each
        piece of the optimizer state (and, stage 2, of the gradient) moved from its old owner to
        its new one, exactly: the state equals a load of a sharded checkpoint at the grown size
        bit for bit. Each joiner calls :meth:`joined`. Closes the old communicator unless
        ``close_old`` is False; returns the grown one."""
        return _elastic.grow(self, n, timeout, self.optimizer, close_old, move_params=False,
                             move_grads=self.stage == 2)

    @classmethod
    def joined(cls, optimizer_class, params, comm, stage: int = 1, bucket_cap_mb: float = 25.0,
               algorithm: str = "auto", **optimizer_kwargs) -> "ZeroOptimizer":
        """A joiner's side of :meth:`grow`: the constructor's arguments as the members gave them
        (``params`` of its own copy of the model), ``comm`` the communicator ``commlib.join()``
        returned. Receives the parameters, its pieces of the optimizer state and gradients, and
        rank 0's param-group hyperparameters (a scheduled ``lr``). Collective with the members' grow."""
        z = cls(optimizer_class, params, comm, stage=stage, bucket_cap_mb=bucket_cap_mb, algorithm=algorithm,
                **optimizer_kwargs)
        _elastic.joined(z, z.optimizer, move_params=False, move_grads=stage == 2)
        return z

    def shrink(self, exclude=None, checkpoint: Optional[str] = None, close_old: bool = True):
        """Go on with the survivors after a rank died: the dead rank's optimizer-state shard had
        no replica, so ``checkpoint`` (a :meth:`save_sharded_checkpoint` directory) is required
        (ValueError before anything is sent without it). ``self.comm.shrink(exclude)``, every
        bucket laid out for the smaller size, the checkpoint loaded (re-sharded). Returns the new
        communicator; the steps since the checkpoint are lost."""
        return _elastic.shrink(self, exclude, checkpoint, close_old, self.load_sharded_checkpoint)

    def _relayout(self, comm):
        for u in self._units:
            u.relayout(comm.size, comm.rank)
        self.comm = comm

    def _drop_failed_step(self):
        """Forget what the last step left: after every step, and before a shrink after one that
        raised (stage 2's buckets in flight on the aborted communicator, a backward its launch
        ended early)."""
        for u in self._units:
            u.tmp_grad = u.work = u.out = None
            u.ready = 0
        self._marked.clear()
        self._launcher.reset()
        self._in_backward = False

    def memory_breakdown(self) -> dict:
        """Bytes this rank holds for parameters, gradients and optimizer state (from tensors)."""
        grads = [u.flat_grad for u in self._units] + [u.shard.grad for u in self._units]
        grads += [p.grad for u in self._units for p in u.params]
        return {"params": storage_bytes(u.flat for u in self._units),
                "grads": storage_bytes(grads),
                "optimizer": storage_bytes(optimizer_state_tensors(self.optimizer)),
                "comm_buffers": storage_bytes(u.tmp_grad for u in self._units)}

    # -- stage 2 hooks --------------------------------------------------------------------------
    def _grad_ready(self, p):
        if not self._in_backward:
            self._in_backward = True
            self._launcher.begin()
            queue_backward_callback(self._finish_backward)
        if id(p) in self._marked:
            return
        self._marked.add(id(p))
        u, i = self._where[id(p)]
        if u.tmp_grad is None:
            u.tmp_grad = torch.zeros(u.layout.padded, dtype=u.flat.dtype, device=u.flat.device)
        o, n = u.layout.offsets[i], u.layout.numels[i]
        u.tmp_grad[o:o + n].copy_(p.grad.reshape(-1))
        p.grad = None                                     # free the unsharded gradient
        self._launcher.gradient_ready(u)

    def _launch(self, u):
        u.out = torch.empty(u.layout.piece, dtype=u.flat.dtype, device=u.flat.device)
        u.work = self.comm.reduce_scatter(u.out, u.tmp_grad, op="avg", algorithm=self.algorithm,
                                          async_op=True)

    def _finish_backward(self):
        try:
            for u in self._units:
                if u.ready < len(u.params):
                    if u.tmp_grad is None:
                        u.tmp_grad = torch.zeros(u.layout.padded, dtype=u.flat.dtype, device=u.flat.device)
                    for i, p in enumerate(u.params):
                        if id(p) not in self._marked and p.grad is not None:  # set by hand
                            o, n = u.layout.offsets[i], u.layout.numels[i]
                            u.tmp_grad[o:o + n].copy_(p.grad.reshape(-1))
                            p.grad = None
                    u.ready = len(u.params)
            self._launcher.launch_rest()
            for u in self._units:
                u.work.wait()
                if u.shard.grad is None:
                    u.shard.grad = u.out
                else:
                    u.shard.grad.add_(u.out)
            self.last_backward_stats = {"buckets": len(self._units),
                                        "launched_during_backward": self._launcher.launched_early}
        finally:
            self._drop_failed_step()  # the step's state goes whether it finished or raised


def __getattr__(name):
    # FullyShardedModule lived here before the split; keep ``commlib.parallel.zero.FullyShardedModule``.
    if name == "FullyShardedModule":
        from .fully_sharded import FullyShardedModule
        return FullyShardedModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
