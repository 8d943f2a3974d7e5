"""Bucketed data parallelism (DDP) on a commlib communicator.

Every rank holds a full replica. Gradients are packed, in reverse parameter order, into buckets of
about ``bucket_cap_mb`` (the first bucket small, so communication starts early); as soon as a
bucket's last gradient has been accumulated (a post-accumulate-grad hook) the bucket is averaged
over all ranks with an asynchronous ``all_reduce`` while backward continues on earlier layers. The
end of backward (an autograd engine callback) launches what is left, waits, and writes the
averages back into ``param.grad``. Buckets are launched strictly in bucket order, so every rank
issues the same sequence of collectives even if gradients become ready in a different order.
"""
from __future__ import annotations

import contextlib
import time
from typing import List, Optional

import torch

from ._buckets import (MB, FlatLayout, broadcast_tensors, bucket_partition, check_algorithm, check_comm,
                       check_one_device, check_positive, check_same_structure,
                       queue_backward_callback, storage_bytes, unique_named_parameters)


class _Bucket:
    __slots__ = ("index", "params", "layout", "buffer", "ready", "work", "launched")

    def __init__(self, index, params, dtype):
        self.index = index
        self.params = params
        self.layout = FlatLayout([""] * len(params), [p.shape for p in params], 1)
        self.buffer = torch.zeros(self.layout.numel, dtype=dtype, device=params[0].device)
        self.ready = 0
        self.work = None
        self.launched = False

    def view(self, i):
        o, n = self.layout.offsets[i], self.layout.numels[i]
        return self.buffer[o:o + n].view(self.layout.shapes[i])


class DataParallel(torch.nn.Module):
    """Wrap ``module`` for synchronous data-parallel training over ``comm``.

    Args:
        module: the model (identical architecture on every rank; parameters on the CPU or on one
            CUDA device: CUDA buckets are reduced on the current stream by the stream engine).
        comm: the communicator whose ranks share the model (passed explicitly, no global group).
        bucket_cap_mb: bucket size in MiB (default 25).
        first_bucket_cap_mb: size of the first bucket (default 1 MiB, or ``bucket_cap_mb`` if
            smaller) so that the first all-reduce starts as early as possible.
        algorithm: the ``all_reduce`` algorithm ("auto", "ring", "rabenseifner", ...).
        broadcast_buffers: re-broadcast buffers (e.g. BatchNorm statistics) from rank 0 at every
            forward, as torch DDP does.
        find_unused_parameters: also agree, after each backward, on which parameters received a
            gradient on no rank; those keep ``grad = None`` (so optimizers skip them) instead of
            getting a zero gradient. Parameters unused on some ranks only always work: a rank
            contributes zeros for a parameter it did not use.
        gradient_as_bucket_view: make ``param.grad`` a view into its bucket after the first
            synchronisation (saves one gradient copy of memory and a copy per step).

    At construction the parameter and buffer shapes are checked to agree on every rank (a clear
    error names the first mismatching one) and rank 0's values are broadcast to all.
    """

    def __init__(self, module: torch.nn.Module, comm, bucket_cap_mb: float = 25.0,
                 first_bucket_cap_mb: Optional[float] = None, algorithm: str = "auto",
                 broadcast_buffers: bool = True, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = False):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
        check_comm(comm)
        cap = check_positive(bucket_cap_mb, "bucket_cap_mb")
        first = min(1.0, cap) if first_bucket_cap_mb is None else \
            check_positive(first_bucket_cap_mb, "first_bucket_cap_mb")
        self.algorithm = check_algorithm("all_reduce", algorithm)
        self.module = module
        self.comm = comm
        self.broadcast_buffers = bool(broadcast_buffers)
        self.find_unused_parameters = bool(find_unused_parameters)
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)

        named = unique_named_parameters(module)
        buffers = list(module.named_buffers())
        device = check_one_device(named, "parameter")
        check_one_device(buffers, "buffer", device)
        specs = [(n, tuple(p.shape), str(p.dtype)) for n, p in named]
        specs += [("buffer:" + n, tuple(b.shape), str(b.dtype)) for n, b in buffers]
        check_same_structure(comm, specs, "parameter")
        broadcast_tensors(comm, [p.data for _, p in named] + [b for _, b in buffers])

        # Buckets: reverse registration order (approximately the order backward produces
        # gradients), one running bucket per dtype.
        trainable = [(n, p) for n, p in named if p.requires_grad]
        self._names = {id(p): n for n, p in trainable}
        rev = list(reversed(trainable))
        pos = {id(p): k for k, (_, p) in enumerate(rev)}
        by_dtype = {}
        for n, p in rev:
            by_dtype.setdefault(p.dtype, []).append(p)
        groups = []
        for dtype, ps in by_dtype.items():
            sizes = [p.numel() * p.element_size() for p in ps]
            for idx in bucket_partition(sizes, int(cap * MB), int(first * MB)):
                groups.append((min(pos[id(ps[i])] for i in idx), dtype, [ps[i] for i in idx]))
        groups.sort(key=lambda g: g[0])  # bucket order follows reverse parameter order
        self._buckets: List[_Bucket] = [_Bucket(i, ps, dt) for i, (_, dt, ps) in enumerate(groups)]
        self._where = {}
        for b in self._buckets:
            for i, p in enumerate(b.params):
                self._where[id(p)] = (b, i)
        self._params = [p for _, p in trainable]
        self._marked = set()
        self._sync = True
        self._in_backward = False
        self._next = 0
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in self._params]
        self.last_backward_stats: dict = {}
        self._t_launch: List[float] = []
        self._launched_in_hook = 0
        self._t_last_grad = 0.0

    # -- user API -------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self.broadcast_buffers and self.comm.size > 1:
            bufs = [b for b in self.module.buffers() if b.numel()]
            if bufs:
                with torch.no_grad():
                    broadcast_tensors(self.comm, bufs)
        return self.module(*args, **kwargs)

    def shrink(self, exclude=None, close_old: bool = True):
        """Go on with the survivors after a rank died (a backward or step raised PeerError):
        ``self.comm.shrink(exclude)`` (every survivor calls this; see Communicator.shrink), the
        old communicator closed (unless ``close_old`` is False), then the new group's rank 0's
        parameters and buffers broadcast, since the failed step may have completed on some
        survivors and not on others. Gradients of the failed backward are dropped: zero them and
        redo the step. Returns the new communicator (docs/fault_tolerance.md).

        A PeerError from here means one more rank died meanwhile: every survivor gets it and
        calls ``shrink`` again (of the old communicator, or of the new one if it was built). The
        store that commlib.init() opened stays open for the new communicator when the old one is
        closed, at this death and every later one."""
        old = self.comm
        new = old.shrink(exclude)
        if close_old:
            old.close()
        self.comm = new
        with torch.no_grad():
            broadcast_tensors(new, [p.data for p in self.module.parameters()] + list(self.module.buffers()))
        return new

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally (no communication) inside this context; the first
        backward outside it synchronises the accumulated gradients."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    @property
    def bucket_sizes(self) -> List[int]:
        """Elements per bucket, in launch order."""
        return [b.buffer.numel() for b in self._buckets]

    @property
    def bucket_param_names(self) -> List[List[str]]:
        return [[self._names[id(p)] for p in b.params] for b in self._buckets]

    def memory_breakdown(self, optimizer=None) -> dict:
        """Bytes held by this rank: parameters, gradients, optimizer state and bucket buffers
        (counted from the tensors actually allocated; views of one buffer count once)."""
        from ._buckets import optimizer_state_tensors
        params = storage_bytes(p for p in self.module.parameters())
        bucket_ptrs = {b.buffer.untyped_storage().data_ptr() for b in self._buckets}
        grads = storage_bytes(p.grad for p in self.module.parameters() if p.grad is not None
                              and p.grad.untyped_storage().data_ptr() not in bucket_ptrs)
        buckets = storage_bytes(b.buffer for b in self._buckets)
        if self.gradient_as_bucket_view:
            grads, buckets = grads + buckets, 0
        return {"params": params, "grads": grads, "optimizer": storage_bytes(
            optimizer_state_tensors(optimizer)), "comm_buffers": buckets}

    # -- hooks ----------------------------------------------------------------------------------
    def _grad_ready(self, p):
        if not self._sync:
            return
        if not self._in_backward:
            self._in_backward = True
            self._launched_in_hook = 0
            self._t_launch = []
            queue_backward_callback(self._finish_backward)
        b, i = self._where[id(p)]
        if id(p) in self._marked:  # the same parameter twice in one backward (reentrant use)
            return
        self._marked.add(id(p))
        view = b.view(i)
        g = p.grad
        if g.data_ptr() != view.data_ptr():
            view.copy_(g)
        b.ready += 1
        self._t_last_grad = time.perf_counter()
        if b.ready == len(b.params):
            n = self._launch_ready()
            self._launched_in_hook += n

    def _launch(self, b: _Bucket):
        b.work = self.comm.all_reduce(b.buffer, op="avg", algorithm=self.algorithm, async_op=True)
        b.launched = True
        self._t_launch.append(time.perf_counter())

    def _launch_ready(self) -> int:
        n = 0
        while self._next < len(self._buckets) and \
                self._buckets[self._next].ready == len(self._buckets[self._next].params):
            self._launch(self._buckets[self._next])
            self._next += 1
            n += 1
        return n

    def _finish_backward(self):
        t_end = time.perf_counter()
        try:
            # Parameters without a gradient this backward: contribute what they have (a gradient
            # accumulated under no_sync) or zeros, so every rank launches every bucket.
            used_local = []
            for p in self._params:
                used = id(p) in self._marked or p.grad is not None
                used_local.append(used)
                if id(p) not in self._marked:
                    b, i = self._where[id(p)]
                    if p.grad is None:
                        b.view(i).zero_()
                    elif p.grad.data_ptr() != b.view(i).data_ptr():
                        b.view(i).copy_(p.grad)
                    b.ready += 1
            while self._next < len(self._buckets):
                self._launch(self._buckets[self._next])
                self._next += 1
            used_any = None
            if self.find_unused_parameters:
                used_any = torch.tensor(used_local, dtype=torch.uint8)
                self.comm.all_reduce(used_any, op="max")
            for b in self._buckets:
                b.work.wait()
            for k, p in enumerate(self._params):
                if used_any is not None and not used_any[k]:
                    continue  # unused on every rank: keep grad None
                b, i = self._where[id(p)]
                view = b.view(i)
                if self.gradient_as_bucket_view:
                    p.grad = view
                elif p.grad is None:
                    p.grad = view.clone()
                elif p.grad.data_ptr() != view.data_ptr():
                    p.grad.copy_(view)
            self.last_backward_stats = {
                "buckets": len(self._buckets),
                "launched_during_backward": self._launched_in_hook,
                "launch_times": list(self._t_launch),
                "last_grad_time": self._t_last_grad,
                "backward_end_time": t_end,
            }
        finally:
            for b in self._buckets:
                b.ready = 0
                b.work = None
                b.launched = False
            self._marked.clear()
            self._next = 0
            self._in_backward = False
