"""ZeRO-3: :class:`FullyShardedModule`, parameters, gradients and optimizer state sharded over a
communicator (flat units as in ``zero_checkpoint.py``; memory formulas in ``zero.py``)."""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import torch

from . import _elastic
from ._buckets import (broadcast_tensors, check_algorithm, check_comm, check_same_structure, module_specs,
                       optimizer_state_tensors, queue_backward_callback, replicate_module, storage_bytes)
from .fsdp_unit import FREE, FsdpUnit, GatherParams, check_floats, default_policy, flatten
from .zero_checkpoint import _load_sharded, _save_sharded

__all__ = ["FullyShardedModule"]


class FullyShardedModule(torch.nn.Module):
    """ZeRO-3: parameters, gradients and optimizer state sharded over ``comm``.

    ``model = FullyShardedModule(model, comm)``; build the optimizer on ``model.parameters()``
    (the fp32 shards) and train as usual.

    Args:
        module: the model (identical on every rank; rank 0's values are broadcast).
        comm: the communicator (explicit; no global group).
        wrap: which submodules become units, each with its own flat shard: ``None`` (every direct
            child that has parameters), a list of submodule names, or a callable
            ``(name, module) -> bool`` applied top-down (the outermost match wins). Parameters
            outside every unit form the root unit.
        mixed_precision: ``None`` (fp32) or ``torch.bfloat16``/``"bf16"`` (also float16): the
            gathered parameters and the computation use that dtype, the shards (master weights),
            the gradient reduction (reduce_scatter) and the optimizer stay fp32. Floating-point
            inputs are cast to that dtype at the root.
        prefetch: launch the all_gather of the next unit (forward order; reverse in backward)
            asynchronously while the current unit computes.
        algorithm: algorithm for the all_gather and reduce_scatter calls.

    Each unit's parameters are all-gathered before its forward (forward pre-hook), freed after
    it, all-gathered again before its backward (hooks on its outputs) and freed after it; its
    gradient is reduce-scattered (averaged) asynchronously and accumulated into the shard's
    ``.grad`` at the end of backward. A parameter shared by two units (tied embeddings) is
    sharded in the root unit instead (listed in ``tied_to_root``). Replacements join with
    :meth:`grow`/:meth:`joined` (the shards move to the grown layout); after a death,
    :meth:`shrink` reloads a sharded checkpoint (docs/fault_tolerance.md).
    """

    def __init__(self, module: torch.nn.Module, comm, wrap=None, mixed_precision=None,
                 prefetch: bool = True, algorithm: str = "auto", _joining: bool = False):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
        check_comm(comm)
        check_algorithm("all_gather", algorithm)
        check_algorithm("reduce_scatter", algorithm)
        mp = {None: None, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
              "fp16": torch.float16, "float16": torch.float16, torch.bfloat16: torch.bfloat16,
              torch.float16: torch.float16, torch.float32: None, "fp32": None}
        if mixed_precision not in mp:
            raise ValueError(f"mixed_precision: expected None, 'bf16', 'fp16' or a torch dtype, "
                             f"got {mixed_precision!r}")
        self.compute_dtype = mp[mixed_precision] or torch.float32
        self.comm = comm
        self.algorithm = algorithm
        self.prefetch = bool(prefetch)
        self.module = module

        # A joiner of a grow (``joined``) receives the parameters as shards, not whole.
        named, buffers, _ = replicate_module(comm, module, check_params=check_floats, broadcast_params=not _joining)
        self._specs = module_specs(named, buffers)
        self._sd_keys = list(module.state_dict().keys())
        self._buffer_names = [n for n, _ in buffers]

        # -- choose units ---------------------------------------------------------------------
        mods = dict(module.named_modules())
        if wrap is None:
            unit_names = default_policy(module)
        elif callable(wrap):
            unit_names = []
            for n, m in module.named_modules():
                if n and not any(n.startswith(u + ".") for u in unit_names) and wrap(n, m):
                    unit_names.append(n)
        else:
            unit_names = list(wrap)
            for n in unit_names:
                if n not in mods or not n:
                    raise ValueError(f"wrap: '{n}' is not a submodule name of the module")
            for a in unit_names:
                for b in unit_names:
                    if a != b and b.startswith(a + "."):
                        raise ValueError(f"wrap: '{b}' is nested inside '{a}'")
        def unit_of(module_name: str) -> str:
            for u in unit_names:
                if module_name == u or module_name.startswith(u + "."):
                    return u
            return ""

        # Every location of every parameter (a tied parameter, e.g. GPT-2's wte.weight and
        # lm_head.weight, appears under several modules). A parameter used from two units belongs
        # to the root unit, gathered for the whole forward and backward, as torch's fully_shard
        # does for a parameter shared by two of its sub-modules: tying needs no configuration.
        locations: Dict[int, list] = {}
        users: Dict[int, set] = {}
        for mname, m in module.named_modules(remove_duplicate=False):
            for pname, p in list(m._parameters.items()):
                if p is None:
                    continue
                users.setdefault(id(p), set()).add(unit_of(mname))
                locations.setdefault(id(p), [])
                if (m, pname) not in [(a, b) for a, b in locations[id(p)]]:
                    locations[id(p)].append((m, pname))
        owner_of = {id(p): (next(iter(users[id(p)])) if len(users[id(p)]) == 1 else "") for _, p in named}
        self.tied_to_root = [n for n, p in named if len(users[id(p)]) > 1]
        self._units: List[FsdpUnit] = []
        self._unit_by_module = {}
        shards = {}
        for uname in unit_names + [""]:
            ps = [(n, p) for n, p in named if owner_of[id(p)] == uname]
            if not ps:
                continue
            m = mods[uname]
            unit = FsdpUnit(uname or "<root>", m, ps, self)
            unit.locations = [locations[id(p)] for _, p in ps]
            unit.requires_grad = [p.requires_grad for _, p in ps]
            self._units.append(unit)
            self._unit_by_module[id(m)] = unit
            shards[(uname or "_root").replace(".", "_")] = unit.shard
        # hand the parameters over: drop them from the modules
        for unit in self._units:
            for locs in unit.locations:
                for m, pname in locs:
                    del m._parameters[pname]
                    m.__dict__[pname] = None
        self.shards = torch.nn.ParameterDict(shards)
        for unit in self._units:
            unit.module.register_forward_pre_hook(self._make_pre_forward(unit))
            unit.module.register_forward_hook(self._make_post_forward(unit))
        self._fwd_order: List[FsdpUnit] = []
        self._order_fixed = False
        #: per forward/backward: units whose all_gather was already launched (prefetched) when
        #: they were needed ("hits") or had to be gathered on demand ("misses")
        self.prefetch_stats: Dict[str, int] = {}
        self._pending = []
        self._in_backward = False

    # -- forward / backward machinery -----------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self.compute_dtype != torch.float32:
            cast = lambda t: t.to(self.compute_dtype) if isinstance(t, torch.Tensor) and \
                t.is_floating_point() else t  # noqa: E731
            args = tuple(cast(a) for a in args)
            kwargs = {k: cast(v) for k, v in kwargs.items()}
        if self._fwd_order and not self._order_fixed:
            self._order_fixed = True
        self.prefetch_stats = {"forward_hits": 0, "forward_misses": 0, "backward_hits": 0,
                               "backward_misses": 0}
        out = self.module(*args, **kwargs)
        return out

    def _set_views(self, unit, flat):
        for (locs, v) in zip(unit.locations, unit.layout.views(flat)):
            for m, pname in locs:
                m.__dict__[pname] = v

    def _next_unit(self, unit, step):
        order = self._fwd_order
        if unit not in order:
            return None
        i = order.index(unit) + step
        return order[i] if 0 <= i < len(order) else None

    def _make_pre_forward(self, unit):
        def hook(module, args):
            if not self._order_fixed and unit not in self._fwd_order:
                self._fwd_order.append(unit)
            self.prefetch_stats["forward_misses" if unit.state == FREE else "forward_hits"] += 1
            unit.ensure_gathered()
            if self.prefetch:
                nxt = self._next_unit(unit, +1)
                if nxt is not None and nxt.state == FREE:
                    nxt.gather_async()
            if torch.is_grad_enabled() and unit.shard.requires_grad:
                flat = GatherParams.apply(unit.shard, unit)
            else:
                flat = unit.full
            self._set_views(unit, flat)
        return hook

    def _make_post_forward(self, unit):
        def hook(module, args, output):
            unit.free()
            for locs in unit.locations:      # no dangling views of the freed buffer
                for m, pname in locs:
                    m.__dict__[pname] = None
            tensors = [t for t in flatten(output) if isinstance(t, torch.Tensor) and t.requires_grad]
            if tensors:
                fired = [False]

                def pre_backward(grad):
                    if not fired[0]:
                        fired[0] = True
                        self._pre_backward(unit)
                    return None
                for t in tensors:
                    t.register_hook(pre_backward)
            return None
        return hook

    def _pre_backward(self, unit):
        if not self._in_backward:
            self._in_backward = True
            queue_backward_callback(self._finish_backward)
        self.prefetch_stats["backward_misses" if unit.state == FREE else "backward_hits"] += 1
        unit.ensure_gathered()
        if self.prefetch:
            prv = self._next_unit(unit, -1)
            if prv is not None and prv.state == FREE:
                prv.gather_async()

    def _post_backward(self, unit, grad_full):
        if not self._in_backward:
            self._in_backward = True
            queue_backward_callback(self._finish_backward)
        g = grad_full.to(torch.float32).contiguous()
        if g.data_ptr() == unit.full.data_ptr():
            g = g.clone()
        out = torch.empty(unit.layout.piece, dtype=torch.float32, device=g.device)
        work = self.comm.reduce_scatter(out, g, op="avg", algorithm=self.algorithm, async_op=True)
        self._pending.append((unit, work, out))
        unit.free()

    def _finish_backward(self):
        try:
            for unit, work, out in self._pending:
                work.wait()
                if unit.shard.grad is None:
                    unit.shard.grad = out
                else:
                    unit.shard.grad.add_(out)
        finally:
            self._pending = []
            self._in_backward = False
            for unit in self._units:
                if unit.state != FREE:
                    unit.free()

    # -- state ----------------------------------------------------------------------------------
    @torch.no_grad()
    def full_state_dict(self, rank0_only: bool = False) -> Dict[str, torch.Tensor]:
        """The unsharded parameters and buffers keyed by the original module's state_dict names
        (fp32 master values, in the parameters' original dtype). Collective. With
        ``rank0_only=True`` only rank 0 gets them (others return ``{}``)."""
        values = {}
        for unit in self._units:
            full = torch.empty(unit.layout.padded, dtype=torch.float32, device=unit.shard.device)
            if rank0_only:
                self.comm.gather(full if self.comm.rank == 0 else None, unit.shard.detach(), root=0)
                if self.comm.rank != 0:
                    continue
            else:
                self.comm.all_gather(full, unit.shard.detach())
            for locs, v, dt in zip(unit.locations, unit.layout.views(full), unit.orig_dtypes):
                for m, pname in locs:
                    values[id(m), pname] = v.clone().to(dt)
        if rank0_only and self.comm.rank != 0:
            return {}
        out = {}
        mods = dict(self.module.named_modules(remove_duplicate=False))
        bufs = dict(self.module.named_buffers(remove_duplicate=False))
        for k in self._sd_keys:
            if k in bufs:
                out[k] = bufs[k].detach().clone()
                continue
            mname, _, pname = k.rpartition(".")
            m = mods[mname]
            out[k] = values[id(m), pname]
        return out

    @torch.no_grad()
    def load_full_state_dict(self, state: Dict[str, torch.Tensor]):
        """Load unsharded parameters (every rank passes the same dict) into the shards."""
        for unit in self._units:
            flat = torch.zeros(unit.layout.padded, dtype=torch.float32, device=unit.shard.device)
            for name, v, shape in zip(unit.param_names, unit.layout.views(flat), unit.layout.shapes):
                if name not in state:
                    raise KeyError(f"state: missing parameter '{name}'")
                if tuple(state[name].shape) != tuple(shape):
                    raise ValueError(f"state: parameter '{name}' has shape "
                                     f"{tuple(state[name].shape)}, the model has {tuple(shape)}")
                v.copy_(state[name])
            unit.shard.copy_(flat[unit.lo:unit.lo + unit.layout.piece])
        bufs = dict(self.module.named_buffers())
        for n, b in bufs.items():
            if n in state:
                b.copy_(state[n])

    def save_sharded_checkpoint(self, path: str, optimizer=None):
        """Save each rank's shards (and ``optimizer``'s state over them) plus meta.json under
        ``path`` (a directory on a filesystem every rank sees). Collective."""
        bufs = {n: b.detach().clone() for n, b in self.module.named_buffers()}
        _save_sharded(path, self.comm, "FullyShardedModule", self._units,
                      [u.shard for u in self._units], optimizer,
                      rank0_files={"buffers.pt": bufs})

    def load_sharded_checkpoint(self, path: str, optimizer=None):
        """Load a checkpoint saved by :meth:`save_sharded_checkpoint` on any world size."""
        _load_sharded(path, self.comm, "FullyShardedModule", self._units,
                      [u.shard for u in self._units], optimizer)
        bf = os.path.join(path, "buffers.pt")
        if os.path.exists(bf):
            saved = torch.load(bf, weights_only=True)
            with torch.no_grad():
                for n, b in self.module.named_buffers():
                    if n in saved:
                        b.copy_(saved[n])

    # -- growing and shrinking (docs/fault_tolerance.md, "commlib.parallel") -----------------------
    def grow(self, n: Optional[int] = None, timeout: Optional[float] = None, optimizer=None,
             close_old: bool = True):
        """Take replacement processes in: ``self.comm.grow(n, timeout)`` (every member calls this,
        between steps), then every unit laid out for the grown size (as a FullyShardedModule built
        at that size) and each piece of its parameters, gradient and (with ``optimizer``, built over
        ``self.parameters()``) optimizer state moved from its old owner to its new one, exactly: no
        rank holds a whole unit, and the result equals a load of a sharded checkpoint at the grown
        size bit for bit. Buffers are rank 0's. Each joiner calls :meth:`joined`. Closes the old
        communicator unless ``close_old`` is False; returns the grown one."""
        return _elastic.grow(self, n, timeout, optimizer, close_old, move_params=True, move_grads=True)

    @classmethod
    def joined(cls, module: torch.nn.Module, comm, optimizer=None, **kwargs):
        """A joiner's side of :meth:`grow`: wrap ``module`` (its own copy of the members' model)
        over ``comm``, the communicator ``commlib.join()`` returned, with the members'
        constructor ``kwargs`` (wrap, mixed_precision, ...), receiving its shards. ``optimizer``:
        a function of the parameters that builds the optimizer as the members built theirs (e.g.
        ``lambda ps: torch.optim.AdamW(ps, lr=1e-3)``), which then receives its piece of their
        state and rank 0's param-group hyperparameters. Returns ``(module, optimizer or None)``.
        Collective with the members' grow."""
        if optimizer is not None and not callable(optimizer):
            raise TypeError(f"optimizer: a function of the parameters that builds the optimizer, got "
                            f"{type(optimizer).__name__}")
        fsdp = cls(module, comm, _joining=True, **kwargs)
        opt = optimizer(fsdp.parameters()) if optimizer is not None else None
        _elastic.joined(fsdp, opt, move_params=True, move_grads=True)
        return fsdp, opt

    def shrink(self, exclude=None, checkpoint: Optional[str] = None, optimizer=None, close_old: bool = True):
        """Go on with the survivors after a rank died: its shards of the parameters and of the
        optimizer state had no replica, so ``checkpoint`` (a :meth:`save_sharded_checkpoint`
        directory) is required (ValueError before anything is sent without it).
        ``self.comm.shrink(exclude)``, every unit laid out for the smaller size, the checkpoint
        loaded (re-sharded, with ``optimizer``'s state). Returns the new communicator."""
        return _elastic.shrink(self, exclude, checkpoint, close_old,
                               lambda path: self.load_sharded_checkpoint(path, optimizer))

    def _relayout(self, comm):
        for unit in self._units:
            unit.relayout(comm)
        self.comm = comm

    def _drop_failed_step(self):
        """Before a shrink: forget what the step that raised left (gathered units, pending
        reduce-scatters of the aborted communicator)."""
        for unit in self._units:
            unit.discard()
        self._pending = []
        self._in_backward = False

    def _agree(self, comm):
        """A joiner's constructor's collectives (structure check, rank 0's buffers), on the members."""
        check_same_structure(comm, self._specs, "parameter")
        broadcast_tensors(comm, list(self.module.buffers()))

    def memory_breakdown(self, optimizer=None) -> dict:
        """Bytes this rank holds (shards, gathered units currently alive, gradient shards,
        optimizer state), counted from the tensors actually allocated."""
        return {"params": storage_bytes([u.shard for u in self._units]),
                "grads": storage_bytes(u.shard.grad for u in self._units),
                "optimizer": storage_bytes(optimizer_state_tensors(optimizer)),
                "comm_buffers": sum(u.full.untyped_storage().nbytes() for u in self._units)}

    @property
    def unit_names(self) -> List[str]:
        return [u.name for u in self._units]

