"""Bucketed data parallelism (DDP) on a commlib communicator.

Every rank holds a full replica. Gradients are packed, in reverse parameter order, into buckets of
about ``bucket_cap_mb`` (the first bucket small, so communication starts early); as soon as a
bucket's last gradient has been accumulated (a post-accumulate-grad hook) the bucket is averaged
over all ranks with an asynchronous ``all_reduce`` while backward continues on earlier layers. The
end of backward (an autograd engine callback) launches what is left, waits, and writes the
averages back into ``param.grad`` (float32/float64 buckets are summed and divided as they are
written back: one pass, not the collective's own division pass). Buckets are launched strictly
in bucket order, so every rank issues the same sequence of collectives even if gradients become
ready in a different order.
"""
from __future__ import annotations

import contextlib
import time
from typing import List, Optional

import torch

from commlib.core.codecs import error_feedback_round
from ._state_transfer import _check_optimizer, broadcast_optimizer_state
from ._buckets import (MB, FlatLayout, OrderedLauncher, broadcast_tensors, check_algorithm, check_comm,
                       check_positive, dtype_buckets, param_slots, queue_backward_callback,
                       replicate_module, storage_bytes)


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
        compress: a codec (name or ``commlib.codecs.Codec``) the buckets' all_reduce travels in
            (CPU or CUDA buckets: the host engine or the stream engine, docs/compression.md);
            None: uncompressed.
        error_feedback: with ``compress``, add to each gradient the residual its last encoding lost
            and encode the sum on this rank before sending (EF-SGD, commlib.core.codecs.error_feedback_round),
            as the gradient is copied into its bucket (one pass on CPU buckets; blocks start at each
            parameter's slice); float32 buckets only. docs/compression.md says which combinations converge.

    At construction the parameter and buffer shapes are checked to agree on every rank (a clear
    error names the first mismatching one) and rank 0's values are broadcast to all.
    """

    def __init__(self, module: torch.nn.Module, comm, bucket_cap_mb: float = 25.0,
                 first_bucket_cap_mb: Optional[float] = None, algorithm: str = "auto",
                 broadcast_buffers: bool = True, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = False, compress=None, error_feedback: bool = False):
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
        from commlib.core import codecs
        self.codec = codecs.get(compress)
        if not isinstance(error_feedback, bool):
            raise TypeError(f"error_feedback: a bool, got {type(error_feedback).__name__}")
        if error_feedback and self.codec is None:
            raise ValueError("error_feedback: needs compress= (an uncompressed all_reduce loses nothing)")
        self.error_feedback = error_feedback
        self._residuals = {}  # bucket index -> what its last encoding lost (error_feedback)
        # The average's division: in the copy of the bucket into param.grad, which happens anyway,
        # instead of the collective's own pass over the bucket (op="avg" divides the whole result on
        # every rank): one pass over the gradients less a step, the same quotients (float32/64:
        # torch divides correctly rounded, as the collective does; NaN payloads are torch's). With
        # gradient_as_bucket_view there is no copy, and other dtypes keep op="avg" (torch may
        # multiply 16-bit floats by the reciprocal).
        self._divide_in_copy = not self.gradient_as_bucket_view

        named, _, _ = replicate_module(comm, module)

        # Buckets: reverse registration order (approximately the order backward produces
        # gradients), one running bucket per dtype.
        trainable = [(n, p) for n, p in named if p.requires_grad]
        self._names = {id(p): n for n, p in trainable}
        rev = list(reversed(trainable))
        pos = {id(p): k for k, (_, p) in enumerate(rev)}
        groups = [(min(pos[id(p)] for p in ps), dtype, ps)
                  for dtype, ps in dtype_buckets([p for _, p in rev], int(cap * MB), int(first * MB))]
        groups.sort(key=lambda g: g[0])  # bucket order follows reverse parameter order
        self._buckets: List[_Bucket] = [_Bucket(i, ps, dt) for i, (_, dt, ps) in enumerate(groups)]
        self._where = param_slots(self._buckets)
        if error_feedback and any(b.buffer.dtype != torch.float32 for b in self._buckets):
            raise ValueError("error_feedback: keeps float32 buckets and residuals only")
        self._divide_in_copy = self._divide_in_copy and all(b.buffer.dtype in (torch.float32, torch.float64)
                                                            for b in self._buckets)
        self._params = [p for _, p in trainable]
        self._marked = set()
        self._sync = True
        self._in_backward = False
        self._launcher = OrderedLauncher(self._buckets, self._launch)
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for p in self._params]
        self.last_backward_stats: dict = {}
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

    def grow(self, n: Optional[int] = None, timeout: Optional[float] = None, optimizer=None,
             close_old: bool = True):
        """Take replacement processes in (docs/fault_tolerance.md, "Growing back"):
        ``self.comm.grow(n, timeout)`` (every member calls this; see Communicator.grow), the old
        communicator closed (unless ``close_old`` is False), then rank 0's parameters, buffers and,
        with ``optimizer``, its optimizer state sent to every rank: each joiner calls
        ``DataParallel.joined(module, comm, optimizer=...)`` with the communicator commlib.join
        gave it, which receives them. Call it between steps (no backward in flight). Returns the
        new communicator. Error feedback's residuals (``compress``) stay per rank: a joiner starts
        with none. A PeerError or RendezvousError from the grow leaves ``self.comm`` as it was."""
        _check_optimizer(optimizer)
        if self._in_backward:
            raise RuntimeError("grow: a backward is in flight; call it between steps")
        old = self.comm
        new = old.grow(n, timeout)
        if close_old:
            old.close()
        self.comm = new
        self._bring_newcomers(optimizer)
        return new

    @classmethod
    def joined(cls, module: torch.nn.Module, comm, optimizer=None, **kwargs) -> "DataParallel":
        """A joiner's side of ``grow``: wrap ``module`` (the same architecture as the members')
        over ``comm``, the communicator ``commlib.join()`` returned, receiving rank 0's
        parameters, buffers and, with ``optimizer`` (built over ``module``'s parameters as the
        members' was), its state. ``kwargs``: DataParallel's own (bucket_cap_mb, algorithm,
        ...), as the members gave them. Collective with the members' ``grow``."""
        _check_optimizer(optimizer)
        dp = cls(module, comm, **kwargs)  # its replicate_module meets the members' in _bring_newcomers
        broadcast_optimizer_state(comm, optimizer)
        return dp

    def _bring_newcomers(self, optimizer):
        """The members' half of ``joined``: the same collectives in the same order."""
        replicate_module(self.comm, self.module)
        broadcast_optimizer_state(self.comm, optimizer)

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
            self._launcher.begin()
            queue_backward_callback(self._finish_backward)
        b, i = self._where[id(p)]
        if id(p) in self._marked:  # the same parameter twice in one backward (reentrant use)
            return
        self._marked.add(id(p))
        view = b.view(i)
        g = p.grad
        if self.error_feedback:
            self._feed_back(b, i, g)
        elif g.data_ptr() != view.data_ptr():
            view.copy_(g)
        self._t_last_grad = time.perf_counter()
        try:
            self._launcher.gradient_ready(b)
        except BaseException:
            # A launch that raised (a peer already seen dead) ends this backward: autograd then
            # skips _finish_backward, so undo here what it would have, or the next backward (the
            # step redone after shrink) would find one "in flight" and never synchronise.
            self._reset_backward()
            raise

    def _feed_back(self, b: _Bucket, i: int, g=None):
        """Error feedback of parameter i's slice of bucket b, as its gradient goes in: the slice
        gets Q(g + e) and e what Q dropped, read from ``g`` (None: what the slice holds), so the
        copy into the bucket and the feedback are one pass over memory (kernels/cpu_error_feedback.h;
        the bucket's blocks start at each slice, which EF-SGD allows: any compressor's residual)."""
        residual = self._residuals.get(b.index)
        if residual is None:
            residual = self._residuals[b.index] = torch.zeros_like(b.buffer)
        o, n = b.layout.offsets[i], b.layout.numels[i]
        view, r = b.view(i), residual[o:o + n]
        if g is not None and g.data_ptr() != view.data_ptr() and (not g.is_contiguous() or view.device.type != "cpu"):
            view.copy_(g)  # (a strided gradient: the pass reads contiguous memory; a device's pass has no src)
            g = None
        src = None if g is None or g.data_ptr() == view.data_ptr() else g
        new = error_feedback_round(self.codec, view, r, src=src)
        if new is not r:  # a replacement step that returns a fresh residual (bench/compress_netns.py's composed arm)
            r.copy_(new)

    def _launch(self, b: _Bucket):
        op = "sum" if self._divide_in_copy else "avg"  # (sum: _finish_backward divides as it copies)
        if self.codec is None:
            b.work = self.comm.all_reduce(b.buffer, op=op, algorithm=self.algorithm, async_op=True)
        else:  # (error feedback ran as each gradient went into the bucket: _feed_back)
            b.work = self.comm.all_reduce(b.buffer, op=op, algorithm=self.algorithm, async_op=True,
                                          compress=self.codec)
        b.launched = True

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
                    if self.error_feedback:
                        self._feed_back(b, i)
                    b.ready += 1
            self._launcher.launch_rest()
            used_any = None
            if self.find_unused_parameters:
                used_any = torch.tensor(used_local, dtype=torch.uint8)
                self.comm.all_reduce(used_any, op="max")
            for b in self._buckets:
                b.work.wait()
            size = self.comm.size
            for k, p in enumerate(self._params):
                if used_any is not None and not used_any[k]:
                    continue  # unused on every rank: keep grad None
                b, i = self._where[id(p)]
                view = b.view(i)
                if self.gradient_as_bucket_view:
                    p.grad = view
                elif not self._divide_in_copy:
                    if p.grad is None:
                        p.grad = view.clone()
                    elif p.grad.data_ptr() != view.data_ptr():
                        p.grad.copy_(view)
                elif p.grad is None:
                    p.grad = torch.div(view, size)
                elif p.grad.data_ptr() != view.data_ptr():
                    torch.div(view, size, out=p.grad)
                else:
                    p.grad.div_(size)
            self.last_backward_stats = {
                "buckets": len(self._buckets),
                "launched_during_backward": self._launcher.launched_early,
                "launch_times": list(self._launcher.launch_times),
                "last_grad_time": self._t_last_grad,
                "backward_end_time": t_end,
            }
        finally:
            self._reset_backward()

    def _reset_backward(self):
        """No backward in flight: buckets, marks and the launcher as before the first gradient."""
        for b in self._buckets:
            b.ready = 0
            b.work = None
            b.launched = False
        self._marked.clear()
        self._launcher.reset()
        self._in_backward = False
