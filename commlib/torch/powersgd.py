"""PowerSGD on commlib's collectives: a DDP communication hook whose collectives every rank issues
in the same order, with any number of gradient buckets.

    import commlib.torch, commlib.torch.hooks as hooks
    state = hooks.PowerSGDState(matrix_approximation_rank=4, start_powerSGD_iter=10)
    ddp.register_comm_hook(state, hooks.powersgd_hook)          # DDP on a "commlib" process group

The algorithm is torch's ``powerSGD_hook`` (Vogels et al., 2019): each bucket's gradient matrices M
(a parameter's gradient viewed as rows x the rest) are approximated by P Q^T of rank r, with P = M Q
averaged over the ranks and orthogonalised, then Q = M^T P averaged; Q is kept for the next step
(warm start: one power iteration a step refines it) and each rank keeps the error M - P Q^T of its
own matrices for the next step (error feedback). Vectors and matrices that would not shrink by
``min_compression_rate`` go whole.

What differs from torch's, and why:

- **One issuing thread per state, fed in bucket order.** torch's hook issues its second and third
  all_reduce from ``.then`` callbacks, which run on the backend's completion thread in the order the
  earlier calls complete; with several buckets they interleave with the next bucket's first call
  differently on different ranks (commlib raises a MismatchError: docs/torch_backend.md). Here the
  hook only queues its bucket; one worker thread runs each bucket's whole step, collectives
  included, in queue order. DDP calls the hook in bucket-index order on every rank, so every rank
  issues the same collectives in the same order, while backward goes on computing the earlier
  layers' gradients beside it. The last bucket's hook waits for the queue to drain, so collectives
  DDP itself issues after it (``find_unused_parameters``'s map) follow ours on every rank too.
- **Two collectives a bucket, not three:** the tensors sent whole travel in the same all_reduce as
  the P's (both are averaged; P's scale does not matter, it is orthogonalised next).
- **Error feedback only where there is an error:** the residual is kept for the compressed
  matrices; tensors sent whole are exact (torch's keeps the local-minus-average of those too, which
  cancels over the ranks).

Every rank ends with bitwise-identical gradients: the P's and Q's are commlib all_reduce results
(identical on every rank), the orthogonalisation and P Q^T are computed from them alike, and the
random start of Q is drawn from a generator seeded alike on every rank. CPU float32/float64
gradients (torch.linalg.qr has no half-precision CPU kernel).
"""
# (no `from __future__ import annotations`: DDP checks the hook's annotations as objects)
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Dict, List

import torch
import torch.distributed as dist

__all__ = ["PowerSGDState", "powersgd_hook"]


class _BucketLayout:
    """One bucket's plan: which gradients are compressed (as n x m matrices of rank r) and which go
    whole, and the memory that persists between steps: ``first`` = [whole tensors | P's] (the first
    all_reduce), ``q_memory`` (the second; the warm start), the residuals of error feedback."""

    def __init__(self, grads: List[torch.Tensor], rank: int, min_rate: float, dtype, generator):
        self.shapes = [tuple(g.shape) for g in grads]
        self.whole, self.matrices = [], []  # indices; (index, n, m, r)
        for i, g in enumerate(grads):
            n = g.shape[0] if g.dim() >= 2 else 0
            m = g.numel() // n if n else 0
            r = min(n, m, rank)
            if n and (n + m) * r * min_rate < n * m:
                self.matrices.append((i, n, m, r))
            else:
                self.whole.append(i)
        self.whole_numel = sum(grads[i].numel() for i in self.whole)
        p_numel = sum(n * r for _, n, _, r in self.matrices)
        self.first = torch.empty(self.whole_numel + p_numel, dtype=dtype)
        self.q_memory = torch.empty(sum(m * r for _, _, m, r in self.matrices), dtype=dtype)
        self.ps, self.qs, self.errors = [], [], []
        p_at, q_at = self.whole_numel, 0
        for _, n, m, r in self.matrices:
            self.ps.append(self.first[p_at:p_at + n * r].view(n, r))
            self.qs.append(self.q_memory[q_at:q_at + m * r].view(m, r))
            self.errors.append(torch.zeros(n, m, dtype=dtype))
            p_at, q_at = p_at + n * r, q_at + m * r
        self.randomize_qs(generator)

    def randomize_qs(self, generator):
        for q in self.qs:
            q.copy_(torch.randn(q.shape, generator=generator, dtype=q.dtype))

    def numel_sent(self) -> int:
        return self.first.numel() + self.q_memory.numel()


def _orthogonalize(p: torch.Tensor) -> None:
    # Householder QR: a column of zeros (a layer with no gradient) gives no NaN, unlike plain
    # Gram-Schmidt without torch's epsilon; deterministic for the same input on every rank.
    p.copy_(torch.linalg.qr(p, mode="reduced").Q)


class PowerSGDState:
    """State of :func:`powersgd_hook`, with torch's ``PowerSGDState``'s names and defaults:
    ``process_group`` (default: the default group, which must be a commlib group),
    ``matrix_approximation_rank`` (r), ``start_powerSGD_iter`` (plain averaging before it: DDP
    rebuilds its buckets after the first step), ``min_compression_rate`` (a matrix is compressed
    only if it shrinks by more), ``use_error_feedback``, ``warm_start`` and ``random_seed`` (Q's
    first draw, the same on every rank). ``close()`` stops its worker thread (also stopped when the
    state is collected)."""

    def __init__(self, process_group=None, matrix_approximation_rank: int = 1,
                 start_powerSGD_iter: int = 1_000, min_compression_rate: float = 2,
                 use_error_feedback: bool = True, warm_start: bool = True, random_seed: int = 0):
        for name, value in (("matrix_approximation_rank", matrix_approximation_rank),
                            ("start_powerSGD_iter", start_powerSGD_iter), ("random_seed", random_seed)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name}: an int, got {type(value).__name__}")
        if matrix_approximation_rank < 1:
            raise ValueError(f"matrix_approximation_rank: at least 1, got {matrix_approximation_rank}")
        if start_powerSGD_iter < 2:  # as torch's: the first step's buckets are rebuilt after it
            raise ValueError(f"start_powerSGD_iter: at least 2 (DDP rebuilds its buckets after the "
                             f"first step), got {start_powerSGD_iter}")
        if not isinstance(min_compression_rate, (int, float)) or min_compression_rate <= 0:
            raise ValueError(f"min_compression_rate: a positive number, got {min_compression_rate!r}")
        for name, value in (("use_error_feedback", use_error_feedback), ("warm_start", warm_start)):
            if not isinstance(value, bool):
                raise TypeError(f"{name}: a bool, got {type(value).__name__}")
        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = float(min_compression_rate)
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.random_seed = random_seed
        self.iter = 0
        self.numel_before = self.numel_after = 0  # elements averaged, and sent, under PowerSGD
        self.layouts: Dict[int, _BucketLayout] = {}
        self._worker = None

    def close(self) -> None:
        """Stop the worker thread once the queued buckets are done."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    def _comm(self):
        from commlib.torch import python_group
        try:
            return python_group(self.process_group).comm
        except TypeError:
            raise TypeError(f"process_group: the hook runs on commlib groups, not "
                            f"{type(self.process_group).__name__}") from None

    def _submit(self, *args):
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="commlib-powersgd")
        return self._worker.submit(self._reduce, *args)

    # -- on the worker thread, one bucket at a time in hook order ----------------------------------
    def _reduce(self, comm, buffer: torch.Tensor, grads: List[torch.Tensor], index: int, last: bool):
        try:
            if self.iter < self.start_powerSGD_iter:
                comm.all_reduce(buffer, op="avg")
            else:
                self._powersgd(comm, grads, index)
        finally:
            if last:
                self.iter += 1

    def _layout(self, grads, index) -> _BucketLayout:
        lay = self.layouts.get(index)
        if lay is None or lay.shapes != [tuple(g.shape) for g in grads]:
            gen = torch.Generator().manual_seed(self.random_seed * 1_000_003 + index)
            lay = _BucketLayout(grads, self.matrix_approximation_rank, self.min_compression_rate,
                                grads[0].dtype, gen)
            self.layouts[index] = lay
        elif not self.warm_start:  # a fresh draw each step, the same on every rank
            lay.randomize_qs(torch.Generator().manual_seed(self.random_seed * 1_000_003 + index + self.iter))
        return lay

    def _powersgd(self, comm, grads: List[torch.Tensor], index: int) -> None:
        lay = self._layout(grads, index)
        for q in lay.qs:  # a fresh draw, or last step's Q that this step's power iteration refines
            _orthogonalize(q)
        whole = [grads[i].view(-1) for i in lay.whole]
        mats = [grads[i].view(n, m) for i, n, m, _ in lay.matrices]
        at = 0
        for t in whole:
            lay.first[at:at + t.numel()].copy_(t)
            at += t.numel()
        for mat, err, p, q in zip(mats, lay.errors, lay.ps, lay.qs):
            if self.use_error_feedback:
                mat.add_(err)
            torch.mm(mat, q, out=p)
        comm.all_reduce(lay.first, op="avg")
        at = 0
        for t in whole:
            t.copy_(lay.first[at:at + t.numel()])
            at += t.numel()
        for mat, p, q in zip(mats, lay.ps, lay.qs):
            _orthogonalize(p)
            torch.mm(mat.t(), p, out=q)
        if lay.qs:
            comm.all_reduce(lay.q_memory, op="avg")
        for mat, err, p, q in zip(mats, lay.errors, lay.ps, lay.qs):
            if self.use_error_feedback:
                err.copy_(mat)
            torch.mm(p, q.t(), out=mat)
            if self.use_error_feedback:
                err.sub_(mat)
        self.numel_before += sum(g.numel() for g in grads)
        self.numel_after += lay.numel_sent()


def powersgd_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: PowerSGD on commlib's all_reduce (see the module's docstring). The
    bucket is queued to the state's worker thread; the returned future holds the averaged (or
    low-rank approximated) bucket."""
    buffer = bucket.buffer()
    if buffer.device.type != "cpu" or buffer.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"bucket: PowerSGD takes CPU float32 or float64 gradients, not {buffer.dtype} "
                         f"on {buffer.device}")
    comm = state._comm()
    fut = torch.futures.Future()
    job = state._submit(comm, buffer, bucket.gradients(), bucket.index(), bucket.is_last())

    def finish(done):
        error = done.exception()
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(buffer)

    job.add_done_callback(finish)
    if bucket.is_last():  # DDP's own collectives after the last hook must follow ours
        wait_futures([job])
    return fut
