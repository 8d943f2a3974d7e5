"""ZeRO: sharded optimizer state (stage 1), sharded gradients (stage 2), sharded parameters
(stage 3, :class:`FullyShardedModule`), and sharded checkpoints that reload on any world size.

Layout. Parameters are grouped into *units* (ZeroOptimizer: buckets of about ``bucket_cap_mb`` in
reverse parameter order; FullyShardedModule: one unit per wrapped submodule). A unit's parameters
are packed back to back into one flat vector of ``numel`` elements, padded to ``piece * P`` (P
ranks, ``piece = ceil(numel / P)``); rank r owns elements ``[r*piece, (r+1)*piece)`` of every unit.
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

Checkpoints (``save_sharded_checkpoint``/``load_sharded_checkpoint``): every rank writes its
pieces (parameters and elementwise optimizer state) to ``shard-RRRRR.pt`` and rank 0 writes
``meta.json`` (format, world size, each unit's parameter names, shapes, ``numel`` and ``piece``,
the optimizer's hyper-parameters). A loader at another world size maps its new piece of each unit
onto the old pieces that overlap it, reading only those files (memory-mapped), so a checkpoint
saved on 2 ranks loads on 3 and one saved on 4 loads on 2.
"""
from __future__ import annotations

import json
import os
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ._buckets import (MB, FlatLayout, bucket_partition, broadcast_tensors, check_algorithm,
                       check_comm, check_cpu_tensors, check_positive, check_same_structure,
                       optimizer_state_tensors, queue_backward_callback, storage_bytes,
                       unique_named_parameters)

FORMAT = "commlib-sharded-v1"


def _shard_file(path, rank):
    return os.path.join(path, f"shard-{rank:05d}.pt")


# ==================================================================================================
# Sharded checkpoints (shared by ZeroOptimizer and FullyShardedModule)
# ==================================================================================================
class _Unit:
    """One flat-sharded group of parameters."""

    def __init__(self, name: str, layout: FlatLayout, rank: int):
        self.name = name
        self.layout = layout
        self.lo = rank * layout.piece          # this rank's piece in flat coordinates
        self.hi = min(layout.numel, self.lo + layout.piece)

    def piece_len(self) -> int:
        """Unpadded elements of this rank's piece (may be 0 on the last ranks)."""
        return max(0, self.hi - self.lo)


def _optimizer_index(optimizer) -> Dict[int, int]:
    idx, k = {}, 0
    for g in optimizer.param_groups:
        for p in g["params"]:
            if id(p) not in idx:
                idx[id(p)] = k
                k += 1
    return idx


def _save_sharded(path: str, comm, kind: str, units: Sequence[_Unit], shards: Sequence[torch.Tensor],
                  optimizer=None, extra: Optional[dict] = None, rank0_files: Optional[dict] = None):
    if comm.rank == 0:
        os.makedirs(path, exist_ok=True)
    comm.barrier()
    payload = {}
    for u, s in zip(units, shards):
        entry = {"param": s.detach()[:u.piece_len()].clone(), "state": {}, "elementwise": []}
        if optimizer is not None:
            for k, v in optimizer.state.get(s, {}).items():
                if isinstance(v, torch.Tensor) and v.shape == s.shape:
                    entry["state"][k] = v.detach()[:u.piece_len()].clone()
                    entry["elementwise"].append(k)
                else:
                    entry["state"][k] = v.detach().clone() if isinstance(v, torch.Tensor) else v
        payload[u.name] = entry
    torch.save(payload, _shard_file(path, comm.rank))
    if comm.rank == 0:
        groups = []
        if optimizer is not None:
            for g in optimizer.param_groups:
                groups.append({k: v for k, v in g.items() if k != "params"})
        meta = {"format": FORMAT, "kind": kind, "world": comm.size,
                "units": {u.name: u.layout.meta() for u in units},
                "unit_order": [u.name for u in units],
                "optimizer_class": None if optimizer is None else type(optimizer).__name__,
                "param_groups": groups, "extra": extra or {}, "time": time.time()}
        for fname, obj in (rank0_files or {}).items():
            torch.save(obj, os.path.join(path, fname))
        tmp = os.path.join(path, "meta.json.tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1, default=str)
        os.replace(tmp, os.path.join(path, "meta.json"))
    comm.barrier()


def read_checkpoint_meta(path: str) -> dict:
    """The ``meta.json`` of a sharded checkpoint directory (raises a clear error if absent)."""
    f = os.path.join(path, "meta.json")
    if not os.path.exists(f):
        raise FileNotFoundError(f"path: no sharded checkpoint at {path!r} (meta.json missing)")
    with open(f) as fh:
        meta = json.load(fh)
    if meta.get("format") != FORMAT:
        raise ValueError(f"path: {path!r} has format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def _load_sharded(path: str, comm, kind: str, units: Sequence[_Unit], shards: Sequence[torch.Tensor],
                  optimizer=None):
    """Fill ``shards`` (and ``optimizer`` state) with this rank's pieces from a checkpoint saved on
    any world size."""
    meta = read_checkpoint_meta(path)
    if meta["kind"] != kind:
        raise ValueError(f"path: checkpoint was saved by {meta['kind']}, not {kind}")
    old_world = int(meta["world"])
    for u in units:
        m = meta["units"].get(u.name)
        if m is None:
            raise ValueError(f"path: checkpoint has no unit '{u.name}' (it has: "
                             f"{', '.join(meta['unit_order'])})")
        lay = u.layout
        if m["names"] != lay.names or [list(s) for s in lay.shapes] != m["shapes"]:
            for i, (a, b) in enumerate(zip(m["names"], lay.names)):
                if a != b or m["shapes"][i] != list(lay.shapes[i]):
                    raise ValueError(f"path: unit '{u.name}' parameter #{i}: checkpoint has "
                                     f"'{a}' {tuple(m['shapes'][i])}, model has '{b}' "
                                     f"{tuple(lay.shapes[i])}")
            raise ValueError(f"path: unit '{u.name}' has {len(m['names'])} parameters in the "
                             f"checkpoint but {len(lay.names)} in the model")
    files: Dict[int, dict] = {}

    def old(k):
        if k not in files:
            files[k] = torch.load(_shard_file(path, k), mmap=True, weights_only=True)
        return files[k]

    index = _optimizer_index(optimizer) if optimizer is not None else {}
    new_state = {}
    for u, s in zip(units, shards):
        old_piece = int(meta["units"][u.name]["piece"])
        ref = old(0)[u.name]                 # every old rank's file holds every unit
        elementwise = ref.get("elementwise", [])
        state: dict = {}
        if optimizer is not None:
            for k, v in ref["state"].items():
                if k in elementwise:
                    state[k] = torch.zeros(s.numel(), dtype=v.dtype)
                else:                        # scalars such as Adam's step: identical everywhere
                    state[k] = v.clone() if isinstance(v, torch.Tensor) else v
        with torch.no_grad():
            s.zero_()
            if old_piece and u.hi > u.lo:
                for k_old in range(u.lo // old_piece, -(-u.hi // old_piece)):
                    a = max(u.lo, k_old * old_piece)
                    b = min(u.hi, (k_old + 1) * old_piece)
                    if b <= a:
                        continue
                    src = old(k_old)[u.name]
                    so = a - k_old * old_piece
                    s[a - u.lo:b - u.lo].copy_(src["param"][so:so + (b - a)])
                    for k in elementwise:
                        if k in state:
                            state[k][a - u.lo:b - u.lo].copy_(src["state"][k][so:so + (b - a)])
        if optimizer is not None and id(s) in index and state:
            new_state[index[id(s)]] = state
    if optimizer is not None:
        sd = optimizer.state_dict()
        sd["state"] = new_state
        saved_groups = meta.get("param_groups") or []
        if saved_groups and len(saved_groups) != len(sd["param_groups"]):
            raise ValueError(f"optimizer: checkpoint has {len(saved_groups)} param groups, the "
                             f"optimizer has {len(sd['param_groups'])}")
        for g, saved in zip(sd["param_groups"], saved_groups):
            for k, v in saved.items():
                g[k] = tuple(v) if isinstance(g.get(k), tuple) and isinstance(v, list) else v
        optimizer.load_state_dict(sd)
    return meta


# ==================================================================================================
# ZeRO-1 / ZeRO-2
# ==================================================================================================
class _ZeroUnit(_Unit):
    def __init__(self, name, params, rank, world, dtype):
        layout = FlatLayout([name + f".{i}" for i in range(len(params))], [p.shape for p in params],
                            world)
        super().__init__(name, layout, rank)
        self.params = params
        self.flat = torch.zeros(layout.padded, dtype=dtype)
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
    ``algorithm`` is used for both the reduce_scatter and the all_gather calls.
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
        for gi, g in enumerate(groups):
            ps = list(g["params"]) if not isinstance(g["params"], torch.Tensor) else [g["params"]]
            for i, p in enumerate(ps):
                if not isinstance(p, torch.Tensor):
                    raise TypeError(f"params: group {gi} item {i} is a {type(p).__name__}, "
                                    "not a tensor")
            check_cpu_tensors([(f"group{gi}.param{i}", p) for i, p in enumerate(ps)])
            specs += [(f"group{gi}.param{i}", tuple(p.shape), str(p.dtype)) for i, p in enumerate(ps)]
            all_params += ps
            ps = [p for p in ps if p.requires_grad]
            opts = {k: v for k, v in g.items() if k != "params"}
            rev = list(reversed(ps))
            by_dtype = {}
            for p in rev:
                by_dtype.setdefault(p.dtype, []).append(p)
            shards = []
            for dtype, dps in by_dtype.items():
                sizes = [p.numel() * p.element_size() for p in dps]
                for bi, idx in enumerate(bucket_partition(sizes, int(cap * MB), int(cap * MB))):
                    u = _ZeroUnit(f"g{gi}.{str(dtype).replace('torch.', '')}.b{bi}",
                                  [dps[i] for i in idx], comm.rank, comm.size, dtype)
                    self._units.append(u)
                    shards.append(u.shard)
            inner_groups.append({"params": shards, **opts})
        if not self._units:
            raise ValueError("params: no parameter requires grad")
        check_same_structure(comm, specs, "parameter")
        # Agree on the initial values: rank 0's (the flat buffers hold the parameters now).
        broadcast_tensors(comm, [u.flat for u in self._units] +
                          [p.data for p in all_params if not p.requires_grad])
        self.optimizer = optimizer_class(inner_groups, **optimizer_kwargs)
        self._where = {}
        for u in self._units:
            for i, p in enumerate(u.params):
                self._where[id(p)] = (u, i)
        self._hooks = []
        self._in_backward = False
        self._next = 0
        self._marked = set()
        if stage == 1:
            for u in self._units:
                u.flat_grad = torch.zeros(u.layout.padded, dtype=u.flat.dtype)
                for p, v in zip(u.params, u.layout.views(u.flat_grad)):
                    p.grad = v
        else:
            for u in self._units:
                for p in u.params:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        self.last_backward_stats: dict = {}

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
                out = torch.empty(u.layout.piece, dtype=u.flat.dtype)
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
            self._t_launch = []
            self._launched_in_hook = 0
            queue_backward_callback(self._finish_backward)
        if id(p) in self._marked:
            return
        self._marked.add(id(p))
        u, i = self._where[id(p)]
        if u.tmp_grad is None:
            u.tmp_grad = torch.zeros(u.layout.padded, dtype=u.flat.dtype)
        o, n = u.layout.offsets[i], u.layout.numels[i]
        u.tmp_grad[o:o + n].copy_(p.grad.reshape(-1))
        p.grad = None                                     # free the unsharded gradient
        u.ready += 1
        if u.ready == len(u.params):
            self._launched_in_hook += self._launch_ready()

    def _launch(self, u):
        u.out = torch.empty(u.layout.piece, dtype=u.flat.dtype)
        u.work = self.comm.reduce_scatter(u.out, u.tmp_grad, op="avg", algorithm=self.algorithm,
                                          async_op=True)
        self._t_launch.append(time.perf_counter())

    def _launch_ready(self) -> int:
        n = 0
        while self._next < len(self._units) and \
                self._units[self._next].ready == len(self._units[self._next].params):
            self._launch(self._units[self._next])
            self._next += 1
            n += 1
        return n

    def _finish_backward(self):
        try:
            for u in self._units:
                if u.ready < len(u.params):
                    if u.tmp_grad is None:
                        u.tmp_grad = torch.zeros(u.layout.padded, dtype=u.flat.dtype)
                    for i, p in enumerate(u.params):
                        if id(p) not in self._marked and p.grad is not None:  # set by hand
                            o, n = u.layout.offsets[i], u.layout.numels[i]
                            u.tmp_grad[o:o + n].copy_(p.grad.reshape(-1))
                            p.grad = None
                    u.ready = len(u.params)
            while self._next < len(self._units):
                self._launch(self._units[self._next])
                self._next += 1
            for u in self._units:
                u.work.wait()
                if u.shard.grad is None:
                    u.shard.grad = u.out
                else:
                    u.shard.grad.add_(u.out)
            self.last_backward_stats = {"buckets": len(self._units),
                                        "launched_during_backward": self._launched_in_hook}
        finally:
            for u in self._units:
                u.tmp_grad = u.work = u.out = None
                u.ready = 0
            self._marked.clear()
            self._next = 0
            self._in_backward = False


# ==================================================================================================
# ZeRO-3
# ==================================================================================================
_FREE, _GATHERING, _GATHERED = 0, 1, 2


class _FsdpUnit(_Unit):
    def __init__(self, name, module, params, owner):
        comm = owner.comm
        layout = FlatLayout([n for n, _ in params], [p.shape for _, p in params], comm.size)
        super().__init__(name, layout, comm.rank)
        self.module = module
        self.owner = owner
        self.param_names = [n for n, _ in params]
        flat = torch.zeros(layout.padded, dtype=torch.float32)
        with torch.no_grad():
            for (_, p), v in zip(params, layout.views(flat)):
                v.copy_(p.detach())
        self.shard = torch.nn.Parameter(flat[layout.piece * comm.rank:
                                             layout.piece * (comm.rank + 1)].clone())
        self.orig_dtypes = [p.dtype for _, p in params]
        self.full = torch.empty(layout.padded, dtype=owner.compute_dtype)
        self._nbytes = self.full.untyped_storage().nbytes()
        self.full.untyped_storage().resize_(0)
        self.state = _FREE
        self.work = None
        self.locations = []          # per parameter: [(submodule, attribute), ...]
        self.bw_hooked = False

    def gather_async(self):
        assert self.state == _FREE
        self.full.untyped_storage().resize_(self._nbytes)
        src = self.shard.detach()
        if self.full.dtype != src.dtype:
            src = src.to(self.full.dtype)
        self.work = self.owner.comm.all_gather(self.full, src, algorithm=self.owner.algorithm,
                                               async_op=True)
        self.state = _GATHERING

    def ensure_gathered(self):
        if self.state == _FREE:
            self.gather_async()
        if self.state == _GATHERING:
            self.work.wait()
            self.work = None
            self.state = _GATHERED

    def free(self):
        if self.state == _GATHERING:
            self.work.wait()
            self.work = None
        self.full.untyped_storage().resize_(0)
        self.state = _FREE


class _GatherParams(torch.autograd.Function):
    """Forward: the unit's gathered flat parameters (already all-gathered into ``unit.full``).
    Backward: hands the flat gradient to the unit's reduce-scatter; the shard's gradient is
    accumulated at the end of backward when the asynchronous reduce-scatter has completed."""

    @staticmethod
    def forward(ctx, shard, unit):
        ctx.unit = unit
        # ``.data``: an alias with its own version counter, so re-gathering into the same storage
        # before backward is not mistaken for an in-place change of saved tensors.
        return unit.full.data

    @staticmethod
    def backward(ctx, grad_full):
        unit = ctx.unit
        unit.owner._post_backward(unit, grad_full)
        return None, None


def _default_policy(root: torch.nn.Module) -> List[str]:
    return [n for n, m in root.named_children() if any(True for _ in m.parameters())]


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
    sharded in the root unit instead (listed in ``tied_to_root``).
    """

    def __init__(self, module: torch.nn.Module, comm, wrap=None, mixed_precision=None,
                 prefetch: bool = True, algorithm: str = "auto"):
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

        named = unique_named_parameters(module)
        buffers = list(module.named_buffers())
        check_cpu_tensors(named, "parameter")
        check_cpu_tensors(buffers, "buffer")
        for n, p in named:
            if not p.dtype.is_floating_point:
                raise ValueError(f"parameter '{n}': dtype {p.dtype} cannot be sharded (floats only)")
        specs = [(n, tuple(p.shape), str(p.dtype)) for n, p in named]
        specs += [("buffer:" + n, tuple(b.shape), str(b.dtype)) for n, b in buffers]
        check_same_structure(comm, specs, "parameter")
        broadcast_tensors(comm, [p.data for _, p in named] + [b for _, b in buffers])
        self._sd_keys = list(module.state_dict().keys())
        self._buffer_names = [n for n, _ in buffers]

        # -- choose units ---------------------------------------------------------------------
        mods = dict(module.named_modules())
        if wrap is None:
            unit_names = _default_policy(module)
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
        self._units: List[_FsdpUnit] = []
        self._unit_by_module = {}
        shards = {}
        for uname in unit_names + [""]:
            ps = [(n, p) for n, p in named if owner_of[id(p)] == uname]
            if not ps:
                continue
            m = mods[uname]
            unit = _FsdpUnit(uname or "<root>", m, ps, self)
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
        self._fwd_order: List[_FsdpUnit] = []
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
            self.prefetch_stats["forward_misses" if unit.state == _FREE else "forward_hits"] += 1
            unit.ensure_gathered()
            if self.prefetch:
                nxt = self._next_unit(unit, +1)
                if nxt is not None and nxt.state == _FREE:
                    nxt.gather_async()
            if torch.is_grad_enabled() and unit.shard.requires_grad:
                flat = _GatherParams.apply(unit.shard, unit)
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
            tensors = [t for t in _flatten(output) if isinstance(t, torch.Tensor) and t.requires_grad]
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
        self.prefetch_stats["backward_misses" if unit.state == _FREE else "backward_hits"] += 1
        unit.ensure_gathered()
        if self.prefetch:
            prv = self._next_unit(unit, -1)
            if prv is not None and prv.state == _FREE:
                prv.gather_async()

    def _post_backward(self, unit, grad_full):
        if not self._in_backward:
            self._in_backward = True
            queue_backward_callback(self._finish_backward)
        g = grad_full.to(torch.float32).contiguous()
        if g.data_ptr() == unit.full.data_ptr():
            g = g.clone()
        out = torch.empty(unit.layout.piece, dtype=torch.float32)
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
                if unit.state != _FREE:
                    unit.free()

    # -- state ----------------------------------------------------------------------------------
    @torch.no_grad()
    def full_state_dict(self, rank0_only: bool = False) -> Dict[str, torch.Tensor]:
        """The unsharded parameters and buffers keyed by the original module's state_dict names
        (fp32 master values, in the parameters' original dtype). Collective. With
        ``rank0_only=True`` only rank 0 gets them (others return ``{}``)."""
        values = {}
        for unit in self._units:
            full = torch.empty(unit.layout.padded, dtype=torch.float32)
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
            flat = torch.zeros(unit.layout.padded, dtype=torch.float32)
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


def _flatten(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _flatten(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _flatten(v)
