"""torch.distributed backend "commlib": a Python ``ProcessGroup`` over a commlib ``Communicator``.

torch lets a backend be written in Python only as a subclass of ``torch.distributed.ProcessGroup``
(the C++ ``Backend`` class cannot be subclassed from Python). ``_create`` (registered by
``commlib.torch``) runs for the default group, every ``new_group`` and every DeviceMesh dimension;
each group gets its own communicator over the group's (already prefixed) store.

Every method turns torch's arguments into one call (or a few) of the communicator:

* tensors are staged as contiguous 1-D buffers of a dtype the core knows (``staging.py``);
* a blocking call (``opts.asyncOp`` False, e.g. ``dist.all_reduce(t)``) runs on the caller's
  thread and raises commlib's own error (``MismatchError``, ``PeerError``, ...); the commonest
  one, all_reduce of one contiguous tensor, goes straight to the core (``fast_path.py``);
* an asynchronous call (``async_op=True``, DDP, functional collectives, FSDP2) is queued on the
  communicator's FIFO worker and completed by the group's completion thread (``work.py``);
* sends and receives are held back and issued as concurrent batches (``p2p.py``); the
  data-movement collectives live in ``data_movement.py``;
* several tensors in one call follow torch's list contract as gloo does (``several.py``).
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Optional

import torch
import torch.distributed as dist
from torch.futures import Future

import commlib._C as _C

from commlib.torch import at_exit, native
from commlib.torch.fast_path import (ALL_REDUCE, BARRIER, BROADCAST, OP_BY_HASH, REDUCE, DoneWorks,
                                     fast_collective)
from commlib.torch.data_movement import DataMovementMixin
from commlib.torch.devices import DeviceTypesMixin, check_one_device
from commlib.torch.p2p import PointToPointMixin
from commlib.torch.several import check_like, check_root_tensor, one_tensor, several_all_reduce
from commlib.torch.shrink import ShrinkMixin
from commlib.torch.staging import (NATIVE, as_bytes, check_reduction, op_of, out_bytes, reduction_staging,
                                   sparse_all_reduce)
from commlib.torch.stream_p2p import DeviceStreams
from commlib.torch.stream_work import StreamWork, cuda_device
from commlib.torch.work import Call, Completer, Work, completed_work, timeout_seconds

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
               "gather", "scatter")
# (in the core's Collective order: the C++ backend takes the algorithms as a list in this order)
assert list(COLLECTIVES) == list(_C.Collective.__members__)[:len(COLLECTIVES)]


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
_timeout_seconds = timeout_seconds


def _create(dist_opts, pg_options):
    """The creator torch calls (extended API) for every group on this backend."""
    if pg_options is not None and not isinstance(pg_options, Options):
        raise TypeError(f"pg_options: expected commlib.torch.Options, got {type(pg_options).__name__}")
    options = pg_options or Options()
    _check_algorithms(options)
    rank, size = dist_opts.group_rank, dist_opts.group_size
    timeout = timeout_seconds(dist_opts.timeout)
    prefix = f"commlib/{dist_opts.group_id}"
    comm = _init_comm(dist_opts.store, rank, size, timeout, prefix)
    group = ProcessGroupCommlib(comm, rank, size, options, dist_opts.timeout)
    # The C++ c10d::Backend over this group (native.py), which torch registers per device and
    # calls through its dispatcher, in a ProcessGroup of our own that torch takes as the group
    # (native.process_group: torch's in all but the name it answers); the Python group alone where
    # that module was not built.
    return native.process_group(native.wrap(group), dist_opts)


def _check_algorithms(options: Options):
    import commlib
    for coll, algo in options.algorithms.items():
        if algo in (None, "auto"):
            continue
        known = commlib.algorithms(coll)
        if algo in commlib.algorithms(coll, one_sided=True) and algo not in known:
            raise ValueError(f"pg_options.algorithms[{coll!r}]: {algo!r} is a one-sided schedule (it reads "
                             "peers' mapped buffers), which the torch backend does not run yet")
        if algo not in known:
            raise ValueError(f"pg_options.algorithms[{coll!r}]: unknown algorithm {algo!r} "
                             f"(expected one of: auto, {', '.join(known)})")


class ProcessGroupCommlib(ShrinkMixin, PointToPointMixin, DataMovementMixin, DeviceTypesMixin,
                          dist.ProcessGroup):
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
        self._completer = Completer(str(id(self)))
        self._lock = threading.RLock()
        self._closed = False
        self._p2p: list = []  # held-back sends and receives (p2p.py)
        self._p2p_streams = DeviceStreams()  # the point-to-point stream per device (stream_p2p.py)
        self._core_address = _C.core_address(comm._core) if hasattr(comm, "_core") else None
        self._done_works = DoneWorks()
        at_exit.track(self)

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

    # -- issuing and completing calls ---------------------------------------------------------
    def _run(self, async_op: bool, result, body, tensors=None):
        """Run ``body(call, async_op)`` (which issues commlib calls) and wrap it in a Work.

        Blocking calls run on this thread and raise commlib's errors directly. Calls on CUDA
        tensors (``tensors``, default ``result``, decides) are ordered on the current stream
        instead (stream_work.py), blocking or not.
        """
        if self._p2p:
            self._flush_p2p()
        device = cuda_device(result if tensors is None else tensors)
        if device is not None:
            call = Call(result)
            body(call, True)  # enqueued on the current stream; the device works poll it
            call.finish()     # copies out of staging buffers: enqueued after it on that stream
            return StreamWork(call.result, device, call.works)
        if async_op and self._completer.on_thread():
            # Issued from a future's callback running on the completion thread (e.g. PowerSGD's
            # hook waits on an all_reduce inside .then): run it here, or it would wait on itself.
            async_op = False
        call = Call(result)
        body(call, async_op)
        if not async_op or not call.works:  # done on this thread
            call.finish()
            return completed_work(call.result)
        fut = Future()
        self._completer.put(call, [(fut, call.result)])
        return Work(fut)

    @staticmethod
    def _issue(call: Call, async_op: bool, work):
        if async_op and work is not None:
            call.works.append(work)

    # -- all_reduce -------------------------------------------------------------------------
    def _allreduce_into(self, call, async_op, tensors, reduce_op):
        op, scale = op_of(reduce_op)
        comm, algo = self._comm, self._algo["all_reduce"]
        for t in tensors:
            if t.layout != torch.strided:  # sparse: gathered and summed, blocking (as gloo does)
                sparse_all_reduce(comm, t, op)
                continue
            buf, op2, fin = reduction_staging(t, op)
            # comm.all_reduce, not its general path alone: the staged buffer is a new offer its
            # latency path takes (tens of us less; docs/torch_backend.md, "Cost of a call")
            w = comm.all_reduce(buf, op=op2, algorithm=algo, async_op=async_op,
                                scale=scale if op2 == "premul_sum" else None)
            self._issue(call, async_op, w)
            if fin is not None:
                call.finals.append(fin)

    def allreduce(self, tensors, opts=None):
        # The latency path (fast_path.py): blocking, one plain tensor, nothing held back. Every
        # latency path below is written out inline: a helper method call costs ~0.15 us here.
        if (opts is not None and not opts.asyncOp and len(tensors) == 1 and not self._p2p
                and self._core_address is not None and fast_collective(
                    self._core_address, ALL_REDUCE, tensors[0], None,
                    OP_BY_HASH.get(hash(opts.reduceOp)), self._algo["all_reduce"], 0, False,
                    None) is None):
            return self._done_works.get(tensors)
        opts = opts if opts is not None else dist.AllreduceOptions()
        if len(tensors) > 1:  # torch's contract for a list (several.py)
            return self._run(opts.asyncOp, list(tensors),
                             lambda c, a: several_all_reduce(self, c, a, list(tensors), opts.reduceOp))
        return self._run(opts.asyncOp, list(tensors),
                         lambda c, a: self._allreduce_into(c, a, tensors, opts.reduceOp))

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        tensors = list(tensors)
        check_one_device(tensors=tensors)
        op = op_of(opts.reduceOp)[0]
        for t in tensors:  # every dtype group's before the first group is sent
            if t.layout == torch.strided:
                check_reduction(t, op)

        def body(call, async_op):
            groups = {}
            for t in tensors:
                groups.setdefault(t.dtype, []).append(t)
            for dt, ts in groups.items():
                if len(ts) == 1 or dt not in NATIVE:
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
        if (opts is not None and not opts.asyncOp and len(tensors) == 1 and not self._p2p
                and self._core_address is not None and fast_collective(
                    self._core_address, BROADCAST, tensors[0], None, None,
                    self._algo["broadcast"], opts.rootRank, False, None) is None):
            return self._done_works.get(tensors)
        opts = opts if opts is not None else dist.BroadcastOptions()
        tensors = list(tensors)
        root = opts.rootRank
        if len(tensors) > 1:  # torch's contract for a list (several.py): the root tensor into every one
            check_like(tensors, tensors[0], "tensors")
            check_root_tensor(tensors, opts.rootTensor)
        moved = tensors[opts.rootTensor] if len(tensors) > 1 else None

        def spread():
            for t in tensors:
                if t is not moved:
                    t.copy_(moved)

        def body(call, async_op):
            for t in tensors if moved is None else [moved]:
                st = out_bytes(t)
                if st.copy and self.rank() == root:
                    st.buf.copy_(as_bytes(t))
                self._issue(call, async_op, self._comm.broadcast(
                    st.buf, root=root, algorithm=self._algo["broadcast"], async_op=async_op))
                if st.copy:
                    call.finals.append(st.done)
            if moved is not None:
                call.finals.append(spread)
        return self._run(opts.asyncOp, tensors, body)

    # -- reduce -----------------------------------------------------------------------------
    def reduce(self, tensors, opts=None):
        if (opts is not None and not opts.asyncOp and len(tensors) == 1 and not self._p2p
                and self._core_address is not None and fast_collective(
                    self._core_address, REDUCE, tensors[0], None,
                    OP_BY_HASH.get(hash(opts.reduceOp)), self._algo["reduce"], opts.rootRank,
                    False, None) is None):
            return self._done_works.get(tensors)
        opts = opts if opts is not None else dist.ReduceOptions()
        tensors = list(tensors)
        one_tensor(tensors, "tensors", "reduce takes one tensor per call")  # (as gloo)
        op, scale = op_of(opts.reduceOp)
        root = opts.rootRank

        def body(call, async_op):
            for t in tensors:
                buf, op2, fin = reduction_staging(t, op)
                self._issue(call, async_op, self._comm.reduce(
                    buf, root=root, op=op2, algorithm=self._algo["reduce"], async_op=async_op,
                    scale=scale if op2 == "premul_sum" else None))
                if fin is not None and self.rank() == root:
                    call.finals.append(fin)
        return self._run(opts.asyncOp, tensors, body)

    # -- barrier ----------------------------------------------------------------------------
    def barrier(self, opts=None):
        if (opts is not None and not opts.asyncOp and not self._p2p
                and self._core_address is not None and fast_collective(
                    self._core_address, BARRIER, None, None, None, "auto", 0, False, None) is None):
            return self._done_works.get([])
        opts = opts if opts is not None else dist.BarrierOptions()
        return self._run(opts.asyncOp, [],
                         lambda c, a: self._issue(c, a, self._comm.barrier(async_op=a)))

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
            except Exception:  # noqa: BLE001 - aborting is best effort
                pass
        self._completer.stop(None if not abort else 5)
        unreported = None
        try:
            self._comm.close()
        except _C.CommError as e:  # a device call failed and no call, wait() or synchronize() said so
            unreported = None if abort else e
        except Exception:  # noqa: BLE001 - closing after a failure
            pass
        self._p2p_streams.close()
        if unreported is not None:
            at_exit.report_unreported(self.rank(), unreported)
            raise unreported

    def _stop_at_exit(self):
        """At interpreter exit: close if nothing is in flight, else abort (peers get an error
        instead of a hang), so no thread of ours is inside a call when the interpreter goes."""
        busy = bool(self._p2p) or not self._completer.idle()
        self._p2p = [] if busy else self._p2p
        self._stop(abort=busy)

    def shutdown(self):
        self._stop(False)

    def abort(self):
        self._stop(True)
