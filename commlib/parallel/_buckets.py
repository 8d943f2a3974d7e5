"""Private helpers shared by the data-parallel wrappers (DataParallel, ZeRO, ParameterServer,
FullyShardedModule): argument checks, the replicate-and-agree prologue, flat layouts, and the
ordered bucket launcher.

Nothing here holds global state: every function takes the communicator it works on.
"""
from __future__ import annotations

import json
import math
import time
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import torch

MB = 1 << 20


# -- argument checks ------------------------------------------------------------------------------
def check_comm(comm, name: str = "comm"):
    """Refuse objects that are not communicators (duck-typed: rank, size, all_reduce)."""
    for attr in ("rank", "size", "all_reduce", "broadcast"):
        if not hasattr(comm, attr):
            raise TypeError(f"{name}: expected a commlib Communicator, got {type(comm).__name__}")


def check_algorithm(collective: str, algorithm) -> str:
    """Validate an algorithm name early (before any collective runs), naming the argument."""
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm: expected a string, got {type(algorithm).__name__}")
    try:
        from commlib.core.schedules import algorithms  # the core's registry, when it is built
        names = algorithms(collective)  # what communicators run (no one-sided schedules)
    except Exception:
        return algorithm
    if algorithm != "auto" and algorithm not in names:
        raise ValueError(f"algorithm: unknown {collective} algorithm '{algorithm}' "
                         f"(expected one of: auto, {', '.join(names)})")
    return algorithm


def check_positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or not math.isfinite(value):
        raise ValueError(f"{name}: expected a positive number, got {value!r}")
    return float(value)


def check_one_device(named: Iterable[Tuple[str, torch.Tensor]], what: str = "parameter", device=None):
    """The one device (CPU or a CUDA device) every tensor of ``named`` is on; ``device`` is the one
    expected (None: the first tensor's). CUDA tensors go to the communicator's stream engine."""
    for name, t in named:
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{what} '{name}': is on {t.device}; commlib moves CPU and CUDA tensors")
        if device is None:
            device = t.device
        elif t.device != device:
            raise ValueError(f"{what} '{name}': is on {t.device} but the others are on {device}; "
                             "put the module on one device")
    return device


def unique_named_parameters(module: torch.nn.Module) -> List[Tuple[str, torch.nn.Parameter]]:
    """Named parameters in registration order, shared parameters once (first name wins)."""
    seen, out = set(), []
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


# -- cross-rank agreement -------------------------------------------------------------------------
def all_gather_bytes(comm, payload: bytes) -> List[bytes]:
    """Every rank's ``payload`` (variable length), in rank order."""
    n = torch.tensor([len(payload)], dtype=torch.int64)
    lens = torch.empty(comm.size, dtype=torch.int64)
    comm.all_gather(lens, n)
    width = max(1, int(lens.max()))
    mine = torch.zeros(width, dtype=torch.uint8)
    if payload:
        mine[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    everyone = torch.empty(width * comm.size, dtype=torch.uint8)
    comm.all_gather(everyone, mine)
    out = []
    for r in range(comm.size):
        out.append(bytes(everyone[r * width:r * width + int(lens[r])].tolist()))
    return out


def check_same_structure(comm, specs: Sequence[Tuple[str, tuple, str]], what: str = "parameter"):
    """Check that every rank holds the same (name, shape, dtype) list; raise on every rank if not.

    The error names the first mismatching entry, the rank that differs and both shapes, e.g.
    ``parameter 'fc.weight': shape (4, 8) on rank 0 but (4, 9) on rank 1``.
    """
    payload = json.dumps([[n, list(s), d] for n, s, d in specs]).encode()
    ranks = [json.loads(b.decode()) for b in all_gather_bytes(comm, payload)]
    ref = ranks[0]
    for r, other in enumerate(ranks[1:], start=1):
        for i in range(max(len(ref), len(other))):
            a = ref[i] if i < len(ref) else None
            b = other[i] if i < len(other) else None
            if a == b:
                continue
            if a is None:
                raise ValueError(f"{what} '{b[0]}': exists on rank {r} but not on rank 0 "
                                 f"(rank 0 has {len(ref)} {what}s, rank {r} has {len(other)})")
            if b is None:
                raise ValueError(f"{what} '{a[0]}': exists on rank 0 but not on rank {r} "
                                 f"(rank 0 has {len(ref)} {what}s, rank {r} has {len(other)})")
            if a[0] != b[0]:
                raise ValueError(f"{what} #{i}: named '{a[0]}' on rank 0 but '{b[0]}' on rank {r} "
                                 "(the model must be built identically on every rank)")
            if a[1] != b[1]:
                raise ValueError(f"{what} '{a[0]}': shape {tuple(a[1])} on rank 0 but "
                                 f"{tuple(b[1])} on rank {r}")
            raise ValueError(f"{what} '{a[0]}': dtype {a[2]} on rank 0 but {b[2]} on rank {r}")


def broadcast_tensors(comm, tensors: Sequence[torch.Tensor], src: int = 0, algorithm="auto"):
    """Broadcast ``tensors`` from ``src`` in place, coalesced into one flat buffer per dtype."""
    by_dtype = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for dtype, group in by_dtype.items():
        flat = torch.cat([t.detach().reshape(-1) for t in group]) if comm.rank == src else \
            torch.empty(sum(t.numel() for t in group), dtype=dtype, device=group[0].device)
        if flat.numel() == 0:
            continue
        comm.broadcast(flat, root=src, algorithm=algorithm)
        if comm.rank != src:
            off = 0
            with torch.no_grad():
                for t in group:
                    t.copy_(flat[off:off + t.numel()].view_as(t))
                    off += t.numel()


def module_specs(named, buffers) -> List[Tuple[str, tuple, str]]:
    """The (name, shape, dtype) list ``check_same_structure`` compares: parameters, then buffers."""
    specs = [(n, tuple(p.shape), str(p.dtype)) for n, p in named]
    return specs + [("buffer:" + n, tuple(b.shape), str(b.dtype)) for n, b in buffers]


def replicate_module(comm, module: torch.nn.Module, src: int = 0,
                     check_params: Optional[Callable[[list], None]] = None, broadcast_params: bool = True):
    """The prologue of every wrapper that replicates ``module`` over ``comm``: its parameters
    (shared ones once) and buffers on one device, ``check_params(named)`` (a wrapper's own
    conditions on the named parameters, before anything is sent), the same names, shapes and
    dtypes on every rank (check_same_structure), then ``src``'s values broadcast to all (the
    buffers only with ``broadcast_params=False``: a joiner of FullyShardedModule's grow, whose
    parameters arrive as shards). Returns (named parameters, named buffers, their device)."""
    named = unique_named_parameters(module)
    buffers = list(module.named_buffers())
    device = check_one_device(named, "parameter")
    check_one_device(buffers, "buffer", device)
    if check_params is not None:
        check_params(named)
    check_same_structure(comm, module_specs(named, buffers), "parameter")
    broadcast_tensors(comm, ([p.data for _, p in named] if broadcast_params else []) + [b for _, b in buffers],
                      src=src)
    return named, buffers, device


# -- memory accounting ----------------------------------------------------------------------------
def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one buffer count once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        s = t.untyped_storage()
        key = s.data_ptr()
        if key in seen or s.nbytes() == 0:
            continue
        seen.add(key)
        total += s.nbytes()
    return total


def optimizer_state_tensors(optimizer) -> List[torch.Tensor]:
    out = []
    if optimizer is None:
        return out
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                out.append(v)
    return out


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc), 0 where unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# -- flat layouts ---------------------------------------------------------------------------------
class FlatLayout:
    """A list of tensors packed back to back into one flat vector, padded to ``size`` pieces.

    ``numel`` is the packed length, ``piece`` the per-rank shard length (``ceil(numel/size)``),
    ``padded`` = ``piece * size``. ``offsets[i]`` is where tensor i starts.
    """

    def __init__(self, names: Sequence[str], shapes: Sequence[torch.Size], world: int):
        self.names = list(names)
        self.shapes = [torch.Size(s) for s in shapes]
        self.numels = [int(math.prod(s)) for s in self.shapes]
        self.offsets = []
        off = 0
        for n in self.numels:
            self.offsets.append(off)
            off += n
        self.numel = off
        self.world = world
        self.piece = -(-off // world) if off else 0
        self.padded = self.piece * world

    def views(self, flat: torch.Tensor) -> List[torch.Tensor]:
        return [flat[o:o + n].view(s) for o, n, s in zip(self.offsets, self.numels, self.shapes)]

    def meta(self) -> dict:
        return {"names": self.names, "shapes": [list(s) for s in self.shapes], "numel": self.numel,
                "piece": self.piece, "world": self.world}


def bucket_partition(sizes_bytes: Sequence[int], cap_bytes: int, first_cap_bytes: int) -> List[List[int]]:
    """Group item indices (already in the desired order) into buckets: the first bucket closes at
    ``first_cap_bytes``, the others at ``cap_bytes`` (a bucket closes once it reaches its cap; an
    item larger than the cap gets a bucket of its own)."""
    buckets, cur, cur_bytes = [], [], 0
    for i, b in enumerate(sizes_bytes):
        cur.append(i)
        cur_bytes += b
        if cur_bytes >= (first_cap_bytes if not buckets else cap_bytes):
            buckets.append(cur)
            cur, cur_bytes = [], 0
    if cur:
        buckets.append(cur)
    return buckets


def dtype_buckets(params: Sequence[torch.Tensor], cap_bytes: int, first_cap_bytes: int):
    """``params`` (in the order their gradients are expected) cut into buckets of one dtype each
    (bucket_partition per dtype): a list of (dtype, params), dtypes in order of first appearance."""
    by_dtype = {}
    for p in params:
        by_dtype.setdefault(p.dtype, []).append(p)
    out = []
    for dtype, ps in by_dtype.items():
        sizes = [p.numel() * p.element_size() for p in ps]
        out += [(dtype, [ps[i] for i in idx]) for idx in bucket_partition(sizes, cap_bytes, first_cap_bytes)]
    return out


def param_slots(buckets) -> dict:
    """Where each parameter of ``buckets`` (each with ``params``) is: id(p) -> (bucket, index)."""
    return {id(p): (b, i) for b in buckets for i, p in enumerate(b.params)}


class OrderedLauncher:
    """Launches a wrapper's gradient buckets during backward, always in the same order: a bucket
    goes once all its gradients are ready and every bucket before it went. Ranks whose hooks fire
    in different orders still launch the same collectives in the same order (a collective's calls
    must match across ranks). Each bucket has ``params`` and a ``ready`` count of its gradients;
    ``launch(bucket)`` starts its collective."""

    def __init__(self, buckets: Sequence, launch: Callable):
        self.buckets = buckets
        self._launch = launch
        self.next = 0               # the first bucket not launched yet
        self.launched_early = 0     # launched from gradient hooks during this backward
        self.launch_times: List[float] = []

    def begin(self):
        """A backward starts: forget the previous one's counts."""
        self.launched_early = 0
        self.launch_times = []

    def gradient_ready(self, bucket):
        """One more gradient of ``bucket`` is ready: launch the leading buckets that are complete."""
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            while self.next < len(self.buckets) and \
                    self.buckets[self.next].ready == len(self.buckets[self.next].params):
                self._launch_next()
                self.launched_early += 1

    def launch_rest(self):
        """Backward is over: launch every bucket not launched yet, in order."""
        while self.next < len(self.buckets):
            self._launch_next()

    def reset(self):
        self.next = 0

    def _launch_next(self):
        self._launch(self.buckets[self.next])
        self.launch_times.append(time.perf_counter())
        self.next += 1


def queue_backward_callback(fn):
    """Run ``fn`` once the current backward pass is over (call from inside an autograd hook)."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)
