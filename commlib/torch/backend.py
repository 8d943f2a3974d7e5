"""torch.distributed backend "commlib": a Python ``ProcessGroup`` over a commlib ``Communicator``.

torch lets a backend be written in Python only as a subclass of ``torch.distributed.ProcessGroup``
(the C++ ``Backend`` class cannot be subclassed from Python). ``_create`` (registered by
``commlib.torch``) runs for the default group, every ``new_group`` and every DeviceMesh dimension;
each group gets its own communicator over the group's (already prefixed) store.

Every method turns torch's arguments into one call (or a few) of the communicator:

* tensors are staged as contiguous 1-D buffers of a dtype the core knows; non-contiguous tensors
  are copied and the result is copied back, other dtypes are moved as bytes (data movement) or
  staged in a wider dtype (reductions);
* a blocking call (``opts.asyncOp`` False, e.g. ``dist.all_reduce(t)``) runs on the caller's
  thread and raises commlib's own error (``MismatchError``, ``PeerError``, ...);
* an asynchronous call (``async_op=True``, DDP, functional collectives, FSDP2) is queued on the
  communicator's FIFO worker; one completion thread per group waits on the works in call order,
  copies results back and completes the ``torch.futures.Future`` behind the returned work with the
  list of output tensors (or with the error, which ``wait()`` re-raises);
* sends and receives are held back and issued as one concurrent batch when something waits on
  them or the next call is made (see ``_p2p_op``), so ``irecv(p); isend(p)`` cannot deadlock on
  the communicator's FIFO.
"""
from __future__ import annotations

import dataclasses
import datetime
import queue
import threading
from typing import Optional

import torch
import torch.distributed as dist
from torch.futures import Future

RedOpType = dist.ReduceOp.RedOpType

_OPS = {
    RedOpType.SUM: "sum",
    RedOpType.AVG: "avg",
    RedOpType.PRODUCT: "prod",
    RedOpType.MIN: "min",
    RedOpType.MAX: "max",
    RedOpType.BAND: "band",
    RedOpType.BOR: "bor",
    RedOpType.BXOR: "bxor",
    RedOpType.PREMUL_SUM: "premul_sum",
}

_NATIVE = frozenset((torch.float32, torch.float64, torch.float16, torch.bfloat16,
                     torch.int8, torch.uint8, torch.int32, torch.int64))

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
               "gather", "scatter")


@dataclasses.dataclass
class Options:
    """Backend options: ``dist.init_process_group("commlib", pg_options=Options(...))`` or
    ``dist.new_group(..., pg_options=Options(...))``.

    ``algorithms`` maps a collective (all_reduce, all_gather, reduce_scatter, all_to_all,
    broadcast, reduce, gather, scatter) to an algorithm name (see ``commlib.algorithms``);
    collectives not named use "auto", which honours ``COMMLIB_ALGO_<COLLECTIVE>``.
    """

    algorithms: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for k in self.algorithms:
            if k not in COLLECTIVES:
                raise ValueError(f"algorithms: unknown collective {k!r} (expected one of: "
                                 f"{', '.join(COLLECTIVES)})")


# -- rendezvous (``_init_comm`` is a seam: a stand-in communicator can be swapped in) ---------------
def _default_init_comm(store, rank, size, timeout_s, prefix):
    import commlib
    return commlib.init(rank=rank, world_size=size, store=store, prefix=prefix, timeout=timeout_s)


_init_comm = _default_init_comm


def _timeout_seconds(timeout) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        s = timeout.total_seconds()
    else:
        s = float(timeout)
    return s if s > 0 else None


def _create(dist_opts, pg_options):
    """The creator torch calls (extended API) for every group on this backend."""
    if pg_options is not None and not isinstance(pg_options, Options):
        raise TypeError(f"pg_options: expected commlib.torch.Options, got {type(pg_options).__name__}")
    options = pg_options or Options()
    _check_algorithms(options)
    rank, size = dist_opts.group_rank, dist_opts.group_size
    timeout = _timeout_seconds(dist_opts.timeout)
    prefix = f"commlib/{dist_opts.group_id}"
    comm = _init_comm(dist_opts.store, rank, size, timeout, prefix)
    return ProcessGroupCommlib(comm, rank, size, options, dist_opts.timeout)


def _check_algorithms(options: Options):
    import commlib
    for coll, algo in options.algorithms.items():
        if algo in (None, "auto"):
            continue
        known = commlib.algorithms(coll)
        if algo not in known:
            raise ValueError(f"pg_options.algorithms[{coll!r}]: unknown algorithm {algo!r} "
                             f"(expected one of: auto, {', '.join(known)})")


# -- staging -------------------------------------------------------------------------------------
def _as_flat(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 1-D tensor sharing t's memory when possible (a copy otherwise)."""
    t = t.detach()
    if t.is_contiguous():
        return t.view(-1)
    return t.contiguous().view(-1)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """Contiguous 1-D buffer of t's bytes (for data movement of dtypes the core does not know)."""
    flat = _as_flat(t)
    return flat if flat.dtype in _NATIVE else flat.view(torch.uint8)


class _Staged:
    """Output staging: ``buf`` is what the core writes; ``done()`` copies it back into ``t``."""

    __slots__ = ("t", "buf", "copy")

    def __init__(self, t: torch.Tensor, buf: torch.Tensor, copy: bool):
        self.t, self.buf, self.copy = t, buf, copy

    def done(self):
        if self.copy:
            with torch.no_grad():
                self.t.copy_(self.buf.view(self.t.shape) if self.buf.dtype == self.t.dtype
                             else self.buf.view(self.t.dtype).view(self.t.shape))


def _out_bytes(t: torch.Tensor) -> _Staged:
    """Stage an output for data movement (same element type or bytes)."""
    if t.is_contiguous():
        flat = t.detach().view(-1)
        return _Staged(t, flat if flat.dtype in _NATIVE else flat.view(torch.uint8), False)
    buf = torch.empty(t.numel(), dtype=t.dtype)
    return _Staged(t, buf if t.dtype in _NATIVE else buf.view(torch.uint8), True)


def _reduction_staging(t: torch.Tensor, op: str):
    """(buffer, op, finalize) for reducing t in place with ``op``.

    Native dtypes reduce directly (through a contiguous copy if needed); bool reduces as uint8
    (sum/max/bor -> max, prod/min/band -> min); complex as pairs of reals (sum, avg, premul_sum);
    other integer dtypes in int64 and other floats in float32, cast back afterwards.
    The finalizers copy into ``t`` and run under ``torch.no_grad()``.
    """
    t_out, t = t, t.detach()
    dt = t.dtype
    if dt in _NATIVE:
        if t.is_contiguous():
            return t.view(-1), op, None
        buf = t.contiguous().view(-1)
        return buf, op, lambda: t_out.copy_(buf.view(t.shape))
    if dt == torch.bool:
        mapped = {"sum": "max", "max": "max", "bor": "max", "avg": "max", "prod": "min",
                  "min": "min", "band": "min", "bxor": "bxor"}.get(op)
        if mapped is None:
            raise ValueError(f"op: {op} is not defined for torch.bool tensors")
        buf = t.contiguous().view(-1).view(torch.uint8)
        if t.is_contiguous():
            return buf, mapped, None
        return buf, mapped, lambda: t_out.copy_(buf.view(torch.bool).view(t.shape))
    if dt.is_complex:
        if op not in ("sum", "avg", "premul_sum"):
            raise ValueError(f"op: {op} is not defined for complex tensors")
        src = t if t.is_contiguous() else t.contiguous()
        buf = torch.view_as_real(src).view(-1)
        if t.is_contiguous():
            return buf, op, None
        return buf, op, lambda: t_out.copy_(src)
    wide = torch.float32 if dt.is_floating_point else torch.int64
    if wide == torch.int64 and op in ("avg", "premul_sum"):
        wide = torch.float64
    buf = t.to(wide).contiguous().view(-1)
    return buf, op, lambda: t_out.copy_(buf.view(t.shape))


def _op_of(reduce_op):
    """(commlib op name, scale or None) from torch's ReduceOp / RedOpType."""
    kind = getattr(reduce_op, "op", reduce_op)
    name = _OPS.get(kind)
    if name is None:
        raise ValueError(f"op: unsupported ReduceOp {reduce_op!r}")
    if name != "premul_sum":
        return name, None
    factor = getattr(reduce_op, "factor", None)
    if factor is None:
        raise ValueError("op: PREMUL_SUM without a factor")
    if isinstance(factor, torch.Tensor):
        factor = factor.item()
    return name, float(factor)


class _Call:
    """The pieces of one torch call: commlib works to wait on, finalizers, the future's value."""

    __slots__ = ("works", "finals", "result")

    def __init__(self, result):
        self.works = []
        self.finals = []
        self.result = result


class ProcessGroupCommlib(dist.ProcessGroup):
    """``torch.distributed.ProcessGroup`` whose collectives run on a commlib communicator."""

    def __init__(self, comm, rank: int, size: int, options: Optional[Options] = None,
                 timeout=None):
        super().__init__(rank, size)
        self._comm = comm
        self._options = options or Options()
        self._timeout = timeout
        self._algo = {c: self._options.algorithms.get(c) or "auto" for c in COLLECTIVES}
        self._group_name = ""
        self._group_desc = ""
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.RLock()
        self._closed = False
        self._p2p: list = []

    # -- identity ---------------------------------------------------------------------------
    def getBackendName(self):
        return "commlib"

    @property
    def comm(self):
        """The commlib communicator behind this group."""
        return self._comm

    @property
    def options(self):
        return self._options

    def getGroupName(self):
        return self._group_name

    def setGroupName(self, name):
        self._group_name = name

    def getGroupDesc(self):
        return self._group_desc

    def setGroupDesc(self, desc):
        self._group_desc = desc

    @property
    def group_name(self):
        return self._group_name

    def __repr__(self):
        return (f"ProcessGroupCommlib(rank={self.rank()}, size={self.size()}, "
                f"name={self._group_name!r})")

    # -- completion -------------------------------------------------------------------------
    def _completer(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            call, futs = item
            try:
                for w in call.works:
                    w.wait()
                with torch.no_grad():
                    for f in call.finals:
                        f()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                for fut, _ in futs:
                    fut.set_exception(exc)
                continue
            for fut, result in futs:
                fut.set_result(result)

    def _submit(self, call: _Call, async_op: bool):
        """Return a torch Work for ``call``; ``call.works`` already hold the commlib works."""
        fut = Future()
        if not call.works:  # nothing queued (completed on this thread)
            with torch.no_grad():
                for f in call.finals:
                    f()
            fut.set_result(call.result)
            return _Work(fut)
        self._enqueue(call, [(fut, call.result)])
        return _Work(fut)

    def _enqueue(self, call: _Call, futs):
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._completer, daemon=True,
                                                    name=f"commlib-torch-{self._group_name}")
                    self._thread.start()
        self._queue.put((call, futs))

    def _run(self, async_op: bool, result, body):
        """Run ``body(call, async_op)`` (which issues commlib calls) and wrap it in a Work.

        Blocking calls run on this thread and raise commlib's errors directly.
        """
        if self._p2p:
            self._flush_p2p()
        if async_op and self._thread is not None and threading.current_thread() is self._thread:
            # Issued from a future's callback running on the completion thread (e.g. PowerSGD's
            # hook waits on an all_reduce inside .then): run it here, or it would wait on itself.
            async_op = False
        call = _Call(result)
        body(call, async_op)
        if not async_op:
            with torch.no_grad():
                for f in call.finals:
                    f()
            call.finals = []
            fut = Future()
            fut.set_result(call.result)
            return _Work(fut)
        return self._submit(call, True)

    @staticmethod
    def _issue(call: _Call, async_op: bool, work):
        if async_op and work is not None:
            call.works.append(work)

    # -- all_reduce -------------------------------------------------------------------------
    def _allreduce_into(self, call, async_op, tensors, reduce_op):
        op, scale = _op_of(reduce_op)
        comm, algo = self._comm, self._algo["all_reduce"]
        for t in tensors:
            buf, op2, fin = _reduction_staging(t, op)
            w = comm.all_reduce(buf, op=op2, algorithm=algo, async_op=async_op,
                                scale=scale if op2 == "premul_sum" else None)
            self._issue(call, async_op, w)
            if fin is not None:
                call.finals.append(fin)

    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        return self._run(opts.asyncOp, list(tensors),
                         lambda c, a: self._allreduce_into(c, a, tensors, opts.reduceOp))

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        tensors = list(tensors)

        def body(call, async_op):
            groups = {}
            for t in tensors:
                groups.setdefault(t.dtype, []).append(t)
            for dt, ts in groups.items():
                if len(ts) == 1 or dt not in _NATIVE:
                    self._allreduce_into(call, async_op, ts, opts.reduceOp)
                    continue
                flat = torch.cat([t.detach().reshape(-1) for t in ts])
                self._allreduce_into(call, async_op, [flat], opts.reduceOp)

                def unpack(ts=ts, flat=flat):
                    off = 0
                    with torch.no_grad():
                        for t in ts:
                            n = t.numel()
                            t.copy_(flat[off:off + n].view(t.shape))
                            off += n
                call.finals.append(unpack)
        return self._run(opts.asyncOp, tensors, body)

    # -- broadcast --------------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        tensors = list(tensors)
        root = opts.rootRank

        def body(call, async_op):
            for t in tensors:
                st = _out_bytes(t)
                if st.copy and self.rank() == root:
                    st.buf.copy_(_bytes(t))
                self._issue(call, async_op, self._comm.broadcast(
                    st.buf, root=root, algorithm=self._algo["broadcast"], async_op=async_op))
                if st.copy:
                    call.finals.append(st.done)
        return self._run(opts.asyncOp, tensors, body)

    # -- reduce -----------------------------------------------------------------------------
    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        tensors = list(tensors)
        op, scale = _op_of(opts.reduceOp)
        root = opts.rootRank

        def body(call, async_op):
            for t in tensors:
                buf, op2, fin = _reduction_staging(t, op)
                self._issue(call, async_op, self._comm.reduce(
                    buf, root=root, op=op2, algorithm=self._algo["reduce"], async_op=async_op,
                    scale=scale if op2 == "premul_sum" else None))
                if fin is not None and self.rank() == root:
                    call.finals.append(fin)
        return self._run(opts.asyncOp, tensors, body)

    # -- all_gather -------------------------------------------------------------------------
    def _gather_flat(self, call, async_op, outputs, inp):
        """all_gather ``inp`` into the list ``outputs`` (one tensor per rank, equal or not)."""
        P = self.size()
        if len(outputs) != P:
            raise ValueError(f"output_tensor_list: has {len(outputs)} tensors, expected {P}")
        src = _bytes(inp)
        n = src.numel()
        sizes = [_bytes(o).numel() if o.dtype == inp.dtype else -1 for o in outputs]
        if any(o.dtype != inp.dtype for o in outputs):
            raise TypeError("output_tensor_list: dtypes differ from the input's")
        if sizes[self.rank()] != n:
            raise ValueError(f"output_tensor_list[{self.rank()}]: has {outputs[self.rank()].numel()}"
                             f" elements, input has {inp.numel()}")
        m = max(sizes)
        if m != n:  # uneven: pad every block to the largest
            padded = torch.zeros(m, dtype=src.dtype)
            padded[:n] = src
            src = padded
        flat = torch.empty(m * P, dtype=src.dtype)
        self._issue(call, async_op, self._comm.all_gather(
            flat, src, algorithm=self._algo["all_gather"], async_op=async_op))

        def unpack():
            with torch.no_grad():
                for r, o in enumerate(outputs):
                    blk = flat[r * m:r * m + sizes[r]]
                    o.copy_(blk.view(o.dtype).view(o.shape) if blk.dtype != o.dtype
                            else blk.view(o.shape))
        call.finals.append(unpack)

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        if len(output_tensors) != len(input_tensors):
            raise ValueError("allgather: one output list per input tensor expected")

        def body(call, async_op):
            for outs, inp in zip(output_tensors, input_tensors):
                self._gather_flat(call, async_op, list(outs), inp)
        return self._run(opts.asyncOp, [list(o) for o in output_tensors], body)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self.allgather(output_lists, input_list, opts)

    def _all_gather_single_into(self, call, async_op, output, inp):
        P = self.size()
        if output.dtype != inp.dtype:
            raise TypeError(f"output_tensor: dtype {output.dtype} differs from input's {inp.dtype}")
        if output.numel() != inp.numel() * P:
            raise ValueError(f"output_tensor: has {output.numel()} elements, expected "
                             f"world_size*input = {P}*{inp.numel()}")
        st = _out_bytes(output)
        src = _bytes(inp)
        self._issue(call, async_op, self._comm.all_gather(
            st.buf, src, algorithm=self._algo["all_gather"], async_op=async_op))
        if st.copy:
            call.finals.append(st.done)

    def all_gather_single(self, output_tensor, input_tensor, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._run(opts.asyncOp, [output_tensor],
                         lambda c, a: self._all_gather_single_into(c, a, output_tensor, input_tensor))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        outs, ins = list(output_tensors), list(input_tensors)

        def body(call, async_op):
            for o, i in zip(outs, ins):
                self._all_gather_single_into(call, async_op, o, i)
        return self._run(opts.asyncOp, outs, body)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # -- reduce_scatter ---------------------------------------------------------------------
    def _reduce_scatter_single_into(self, call, async_op, output, inp, reduce_op):
        P = self.size()
        op, scale = _op_of(reduce_op)
        if output.dtype != inp.dtype:
            raise TypeError(f"output: dtype {output.dtype} differs from input's {inp.dtype}")
        if inp.numel() != output.numel() * P:
            raise ValueError(f"input: has {inp.numel()} elements, expected world_size*output = "
                             f"{P}*{output.numel()}")
        obuf, op2, fin = _reduction_staging(output, op)
        ibuf, _, _ = _reduction_staging(inp, op)  # read only: views are fine
        self._issue(call, async_op, self._comm.reduce_scatter(
            obuf, ibuf, op=op2, algorithm=self._algo["reduce_scatter"], async_op=async_op,
            scale=scale if op2 == "premul_sum" else None))
        if fin is not None:
            call.finals.append(fin)

    def reduce_scatter_single(self, output_tensor, input_tensor, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._run(opts.asyncOp, [output_tensor], lambda c, a: self._reduce_scatter_single_into(
            c, a, output_tensor, input_tensor, opts.reduceOp))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        outs, ins = list(output_tensors), list(input_tensors)

        def body(call, async_op):
            for o, i in zip(outs, ins):
                self._reduce_scatter_single_into(call, async_op, o, i, opts.reduceOp)
        return self._run(opts.asyncOp, outs, body)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        outs = list(output_tensors)
        P = self.size()

        def body(call, async_op):
            for out, ins in zip(outs, input_tensors):
                ins = list(ins)
                if len(ins) != P:
                    raise ValueError(f"input_list: has {len(ins)} tensors, expected {P}")
                sizes = [x.numel() for x in ins]
                if sizes[self.rank()] != out.numel():
                    raise ValueError(f"input_list[{self.rank()}]: has {sizes[self.rank()]} elements,"
                                     f" output has {out.numel()}")
                m = max(sizes)
                if all(s == m for s in sizes):
                    flat = torch.cat([x.detach().reshape(-1) for x in ins])
                else:  # uneven blocks: pad each to the largest (padding is discarded)
                    flat = torch.zeros(m * P, dtype=out.dtype)
                    for r, x in enumerate(ins):
                        flat[r * m:r * m + sizes[r]] = x.detach().reshape(-1)
                tmp = torch.empty(m, dtype=out.dtype)
                self._reduce_scatter_single_into(call, async_op, tmp, flat, opts.reduceOp)

                def fin(out=out, tmp=tmp):
                    with torch.no_grad():
                        out.copy_(tmp[:out.numel()].view(out.shape))
                call.finals.append(fin)
        return self._run(opts.asyncOp, outs, body)

    # -- all_to_all -------------------------------------------------------------------------
    def _alltoallv(self, call, async_op, obuf, ibuf, osplits, isplits):
        equal = (all(s == osplits[0] for s in osplits) and list(osplits) == list(isplits)
                 and obuf.numel() == ibuf.numel())
        if equal:
            w = self._comm.all_to_all(obuf, ibuf, algorithm=self._algo["all_to_all"],
                                      async_op=async_op)
        else:
            w = self._comm.all_to_all(obuf, ibuf, async_op=async_op,
                                      output_splits=list(osplits), input_splits=list(isplits))
        self._issue(call, async_op, w)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        P = self.size()

        def body(call, async_op):
            if output.dtype != input.dtype:
                raise TypeError(f"output: dtype {output.dtype} differs from input's {input.dtype}")
            st = _out_bytes(output)
            ibuf = _bytes(input)
            if ibuf.data_ptr() == st.buf.data_ptr() and ibuf.numel():
                ibuf = ibuf.clone()
            o_row = st.buf.numel() // output.shape[0] if output.dim() and output.shape[0] else 0
            i_row = ibuf.numel() // input.shape[0] if input.dim() and input.shape[0] else 0
            if output_split_sizes:
                osp = [int(s) * o_row for s in output_split_sizes]
            else:
                if st.buf.numel() % P:
                    raise ValueError(f"output: {output.numel()} elements do not split over {P} ranks")
                osp = [st.buf.numel() // P] * P
            if input_split_sizes:
                isp = [int(s) * i_row for s in input_split_sizes]
            else:
                if ibuf.numel() % P:
                    raise ValueError(f"input: {input.numel()} elements do not split over {P} ranks")
                isp = [ibuf.numel() // P] * P
            self._alltoallv(call, async_op, st.buf, ibuf, osp, isp)
            if st.copy:
                call.finals.append(st.done)
        return self._run(opts.asyncOp, [output], body)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        outs, ins = list(output_tensors), list(input_tensors)
        P = self.size()

        def body(call, async_op):
            if len(outs) != P or len(ins) != P:
                raise ValueError(f"alltoall: expected {P} output and {P} input tensors")
            dt = ins[0].dtype
            if any(x.dtype != dt for x in outs + ins):
                raise TypeError("alltoall: all tensors must have the same dtype")
            ib = [_bytes(x) for x in ins]
            ibuf = torch.cat(ib) if ib else torch.empty(0)
            osp = [_bytes(o).numel() if o.is_contiguous() else o.numel() * (
                1 if o.dtype in _NATIVE else o.element_size()) for o in outs]
            obuf = torch.empty(sum(osp), dtype=ibuf.dtype)
            self._alltoallv(call, async_op, obuf, ibuf, osp, [x.numel() for x in ib])

            def unpack():
                off = 0
                with torch.no_grad():
                    for o, n in zip(outs, osp):
                        blk = obuf[off:off + n]
                        o.copy_(blk.view(o.dtype).view(o.shape) if blk.dtype != o.dtype
                                else blk.view(o.shape))
                        off += n
            call.finals.append(unpack)
        return self._run(opts.asyncOp, outs, body)

    # -- gather / scatter -------------------------------------------------------------------
    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        root = opts.rootRank
        P = self.size()
        inp = input_tensors[0]

        def body(call, async_op):
            src = _bytes(inp)
            flat = None
            outs = list(output_tensors[0]) if self.rank() == root else []
            if self.rank() == root:
                if len(outs) != P:
                    raise ValueError(f"gather_list: has {len(outs)} tensors, expected {P}")
                for r, o in enumerate(outs):
                    if o.numel() != inp.numel() or o.dtype != inp.dtype:
                        raise ValueError(f"gather_list[{r}]: size/dtype differs from the input's")
                flat = torch.empty(src.numel() * P, dtype=src.dtype)
            self._issue(call, async_op, self._comm.gather(
                flat, src, root=root, algorithm=self._algo["gather"], async_op=async_op))
            if self.rank() == root:
                n = src.numel()

                def unpack():
                    with torch.no_grad():
                        for r, o in enumerate(outs):
                            blk = flat[r * n:(r + 1) * n]
                            o.copy_(blk.view(o.dtype).view(o.shape) if blk.dtype != o.dtype
                                    else blk.view(o.shape))
                call.finals.append(unpack)
        result = [list(o) for o in output_tensors] if output_tensors else []
        return self._run(opts.asyncOp, result, body)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        root = opts.rootRank
        P = self.size()
        out = output_tensors[0]

        def body(call, async_op):
            st = _out_bytes(out)
            flat = None
            if self.rank() == root:
                ins = list(input_tensors[0])
                if len(ins) != P:
                    raise ValueError(f"scatter_list: has {len(ins)} tensors, expected {P}")
                for r, x in enumerate(ins):
                    if x.numel() != out.numel() or x.dtype != out.dtype:
                        raise ValueError(f"scatter_list[{r}]: size/dtype differs from the output's")
                flat = torch.cat([_bytes(x) for x in ins])
            self._issue(call, async_op, self._comm.scatter(
                st.buf, flat, root=root, algorithm=self._algo["scatter"], async_op=async_op))
            if st.copy:
                call.finals.append(st.done)
        return self._run(opts.asyncOp, list(output_tensors), body)

    # -- barrier, point to point --------------------------------------------------------------
    def barrier(self, opts=None):
        opts = opts if opts is not None else dist.BarrierOptions()
        return self._run(opts.asyncOp, [],
                         lambda c, a: self._issue(c, a, self._comm.barrier(async_op=a)))

    # Point to point. torch issues isend/irecv (and batch_isend_irecv) one op at a time, but a
    # commlib communicator runs its calls in FIFO order, so "irecv(peer); isend(peer)" on both
    # ranks would deadlock. Sends and receives are therefore held back and issued together as one
    # commlib batch (concurrently) when something waits on one of them, when any other call is
    # made on the group.
    def _p2p_op(self, kind, tensors, peer):
        peer = int(peer)
        if not 0 <= peer < self.size() or peer == self.rank():
            raise ValueError(f"{'dst' if kind == 'send' else 'src'}: invalid peer {peer} for "
                             f"rank {self.rank()} of a group of {self.size()}")
        fut = Future()
        tensors = list(tensors)
        ops, finals = [], []
        for t in tensors:
            if kind == "send":
                buf = _as_flat(t).view(torch.uint8) if t.numel() else None
                st = None
            else:
                st = _out_bytes(t)
                buf = st.buf.view(torch.uint8) if st.buf.numel() else None
                if st.copy:
                    finals.append(st.done)
            if buf is not None:
                ops.append((kind, buf, peer))
        with self._lock:
            for i, op in enumerate(ops):
                last = i == len(ops) - 1
                self._p2p.append((op, finals if last else [], (fut, tensors) if last else None))
            if not ops:
                fut.set_result(tensors)
        return _P2PWork(self, fut)

    def _flush_p2p(self):
        with self._lock:
            self._flush_p2p_locked()

    def _flush_p2p_locked(self):
        """Issue the held-back sends/receives. A commlib batch takes at most one send to and one
        receive from each peer, so the k-th operation of each (kind, peer) goes into batch k;
        batches run in order, which keeps messages between a pair of ranks in call order."""
        pending, self._p2p = self._p2p, []
        if not pending:
            return
        rounds: list = []
        seen: dict = {}
        for op, _, _ in pending:
            key = (op[0], op[2])
            k = seen.get(key, 0)
            seen[key] = k + 1
            if k == len(rounds):
                rounds.append([])
            rounds[k].append(op)
        call = _Call(None)
        futs = []
        try:
            for batch in rounds:
                call.works.append(self._comm.batch_p2p(batch, async_op=True))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiters
            for _, _, fr in pending:
                if fr is not None:
                    fr[0].set_exception(exc)
            if call.works:  # wait for what was issued before failing
                self._enqueue(call, [])
            return
        for _, finals, fr in pending:
            call.finals.extend(finals)
            if fr is not None:
                futs.append(fr)
        self._enqueue(call, futs)

    def send(self, tensors, dst, tag=0):
        return self._p2p_op("send", tensors, dst)

    def recv(self, tensors, src, tag=0):
        return self._p2p_op("recv", tensors, src)

    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError("commlib backend: recv from any source is not supported "
                                  "(pass src=)")

    # -- lifetime ---------------------------------------------------------------------------
    def _stop(self, abort: bool):
        if self._closed:
            return
        if not abort:
            self._flush_p2p()
        self._closed = True
        if abort:
            try:
                self._comm.abort("process group aborted")
            except Exception:
                pass
        if self._thread is not None:
            self._queue.put(None)
            if self._thread is not threading.current_thread():
                self._thread.join(timeout=None if not abort else 5)
        try:
            self._comm.close()
        except Exception:
            pass

    def shutdown(self):
        self._stop(False)

    def abort(self):
        self._stop(True)


class _Work(dist.Work):
    """torch Work over a ``torch.futures.Future`` whose value is the list of output tensors.

    Unlike ``_create_work_from_future`` (whose ``wait()`` swallows the future's error), ``wait()``
    raises the commlib error (MismatchError, PeerError, ...) that failed the call.
    """

    def __init__(self, fut):
        super().__init__()
        self._fut = fut

    def wait(self, timeout=None):
        secs = _timeout_seconds(timeout)
        if secs is not None and not self._fut.done():
            import time
            deadline = time.monotonic() + secs
            delay = 1e-5
            while not self._fut.done():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"commlib backend: work not completed within {secs:g} s")
                time.sleep(delay)
                delay = min(delay * 2, 1e-3)
        self._fut.wait()  # raises the call's error
        return True

    def get_future(self):
        return self._fut

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        if not self._fut.done():
            return False
        try:
            self._fut.wait()
        except Exception:  # noqa: BLE001
            return False
        return True

    def exception(self):
        if not self._fut.done():
            return None
        try:
            self._fut.wait()
        except Exception as exc:  # noqa: BLE001
            return exc
        return None

    def result(self):
        return self._fut.wait()

    def synchronize(self):
        pass


class _P2PWork(_Work):
    """Work of a send/recv: waiting (or polling) on it first issues the held-back batch."""

    def __init__(self, pg, fut):
        super().__init__(fut)
        self._pg = pg

    def wait(self, timeout=None):
        self._pg._flush_p2p()
        return super().wait(timeout)

    def get_future(self):
        self._pg._flush_p2p()
        return self._fut

    def is_completed(self):
        self._pg._flush_p2p()
        return self._fut.done()
