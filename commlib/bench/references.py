"""The buffers of one call shape and the inputs and expected outputs every rank checks a sweep's
calls against (commlib/bench/sweep.py's ``-c``): built once per (collective, size) and reused by
every algorithm and mode."""
from __future__ import annotations

import numpy as np

from commlib.perf import common as C


def make_buffers(collective, mode, block, dtype, rank, size, root):
    """The buffers of one call shape: dict with 'send' and 'recv' (either may be a view of the other).

    Sizes and in-place placement come from the core's shapes table (``_C.buffer_shapes``): ``recv``
    is None where this rank has no output (gather off the root) and ``send`` None where it has no
    input (scatter and broadcast off the root; broadcast's root sends from ``recv``).
    """
    import commlib._C as _C
    from commlib.core.call_spec import COLLECTIVE
    n_in, n_out, input_at, output_at = _C.buffer_shapes(COLLECTIVE[collective], block, size, rank, root)
    inplace = mode == "in"
    recv = C.empty(n_out, dtype) if n_out is not None else None
    if n_in is None:
        send = None
    elif inplace and input_at is not None:
        send = recv[input_at:input_at + n_in]
    elif inplace and output_at is not None:
        send = C.empty(n_in, dtype)
        recv = send[output_at:output_at + n_out]
    else:
        send = C.empty(n_in, dtype)
    if collective == "broadcast" and send is None:
        send = recv  # broadcast is one tensor on every rank
    return {"send": send, "recv": recv}


class Reference:
    """Inputs and expected outputs of one (collective, size) for one rank, built once and reused by
    every algorithm and mode."""

    def __init__(self, collective, count, block, dtype, op, rank, P, root):
        self.collective, self.count, self.block = collective, count, block
        self.dtype, self.op, self.rank, self.P, self.root = dtype, op, rank, P, root
        r = rank
        if collective in ("all_reduce", "reduce", "reduce_scatter", "all_to_all"):
            self.input = C.values(r, 0, count, op, dtype)
        elif collective in ("all_gather", "gather"):
            self.input = C.values(r, r * block, block, op, dtype)
        else:  # broadcast, scatter: the root's data
            self.input = C.values(root, 0, count, op, dtype) if r == root else None
        exp = None
        if collective == "all_reduce" or (collective == "reduce" and r == root):
            exp = C.reduced(P, 0, count, op, dtype)
        elif collective == "reduce_scatter":
            exp = C.reduced(P, r * block, block, op, dtype)
        elif collective == "all_gather" or (collective == "gather" and r == root):
            exp = np.concatenate([C.values(q, q * block, block, op, dtype) for q in range(P)])
        elif collective == "all_to_all":
            exp = np.concatenate([C.values(q, r * block, block, op, dtype) for q in range(P)])
        elif collective == "broadcast":
            exp = C.values(root, 0, count, op, dtype)
        elif collective == "scatter":
            exp = C.values(root, r * block, block, op, dtype)
        self.expected = exp

    def prepare(self, bufs):
        """Fresh input; output (where distinct) filled with a sentinel that no result equals."""
        send, recv = bufs["send"], bufs["recv"]
        coll = self.collective
        if recv is not None and recv is not send:
            C.fill(recv, np.full(numel(recv), 99.0 if not self.dtype.startswith("uint") else 250.0))
        if coll == "broadcast" and self.rank != self.root:
            C.fill(send, np.full(self.count, 99.0))
            return
        if send is None or self.input is None:
            return
        C.fill(send, self.input)

    def wrong(self, bufs, codec: str = "") -> int:
        if self.expected is None:
            return 0
        out = bufs["recv"]
        if codec:  # compress=: within the codec's bound (every |value| <= 4, so sums of |values| <= 4P)
            from commlib.core.codecs import DTYPE_EPS, ERROR_BOUND
            tol = (self.P + 1) * (ERROR_BOUND[codec.partition(":")[0]] + DTYPE_EPS[self.dtype]) * 4 * self.P
            return int(np.count_nonzero(~(np.abs(C.as_numpy_f64(out) - self.expected) <= tol)))
        return C.count_wrong(out, self.expected, self.dtype, self.op)


def numel(buf):
    """Elements of a NumPy array, torch tensor or commlib.emulated array."""
    if isinstance(buf, np.ndarray):
        return buf.size
    return buf.numel() if hasattr(buf, "numel") else len(buf)  # torch / commlib.emulated
