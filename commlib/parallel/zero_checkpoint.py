"""Sharded checkpoints shared by ZeroOptimizer (zero.py) and FullyShardedModule (fully_sharded.py).

Layout. Parameters are grouped into *units* (ZeroOptimizer: buckets of about ``bucket_cap_mb`` in
reverse parameter order; FullyShardedModule: one unit per wrapped submodule). A unit's parameters
are packed back to back into one flat vector of ``numel`` elements, padded to ``piece * P`` (P
ranks, ``piece = ceil(numel / P)``); rank r owns elements ``[r*piece, (r+1)*piece)`` of every unit.

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
from typing import Dict, Optional, Sequence

import torch

from ._buckets import FlatLayout

FORMAT = "commlib-sharded-v1"


def _shard_file(path, rank):
    return os.path.join(path, f"shard-{rank:05d}.pt")


class _Unit:
    """One flat-sharded group of parameters."""

    def __init__(self, name: str, layout: FlatLayout, rank: int):
        self.name = name
        self.set_layout(layout, rank)

    def set_layout(self, layout: FlatLayout, rank: int):
        """Lay the unit out as ``layout`` (its world size) with this rank's piece (a grow or a
        shrink lays every unit out again for the new size)."""
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
                    state[k] = torch.zeros(s.numel(), dtype=v.dtype, device=s.device)
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
