"""The Python face of a communicator: argument checks, then one call into the C++ executor.

Every check happens before anything is sent and names the argument at fault (the shared ones in
commlib/core/call_checks.py, the point-to-point messages worked out in commlib/core/p2p_plan.py). The C++ core
then runs the schedule with the GIL released, on the caller's thread when nothing is queued (the
latency path) or on the communicator's FIFO worker for ``async_op=True``.
"""
from __future__ import annotations

import ctypes
import os
import weakref
from typing import Optional, Sequence

import commlib._C as _C
from commlib.device.host_buffers import describe
from commlib.core.call_spec import COLLECTIVE, DTYPE, OP
from commlib.core.codecs import compressed_call, run_compressed
from commlib.core.comm_groups import GroupMethods
from commlib.core.comm_lifetime import LifetimeMethods
from commlib.core.comm_p2p import PointToPointMethods
from commlib.core.device_route import DeviceRoute
from commlib.core.dropped_close import Leftovers
from commlib.core.failure import CommunicatorFailure
from commlib.core.call_checks import (as_rank, check_algorithm, check_keywords, check_op, describe_like,
                                      device_buffers_of, named_device_buffers, check_one_sided_on_host)
from commlib.core.p2p_plan import plan_all_to_allv
from commlib.device.route_context import RouteContext
from commlib.core.work import Work  # noqa: F401  (re-exported: commlib.core.communicator.Work)

# The one C++ entry (csrc/bindings/fast_call.cc), every collective's first try: it reads the buffers,
# runs blocking host calls and the device calls the route's DeviceCallCache holds (checked before),
# and answers NotImplemented otherwise; the general path after it validates and explains (and fills
# the cache for device buffers). Codes are _C.COLLECTIVES positions.
_fast = _C.fast_collective
# An async host call through the entry answers with this module's Work, as the Python path does.
_C.set_host_work(Work)
# (input, output, input_at, output_at) elements of one rank's buffers (csrc/common/shapes.h).
_shapes = _C.buffer_shapes
(_ALL_REDUCE, _ALL_GATHER, _REDUCE_SCATTER, _ALL_TO_ALL, _BROADCAST, _REDUCE, _GATHER, _SCATTER,
 _BARRIER) = range(9)
assert _C.COLLECTIVES[:9] == ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                              "reduce", "gather", "scatter", "barrier"]


class Communicator(PointToPointMethods, LifetimeMethods, GroupMethods, CommunicatorFailure):
    """A group of ranks that run collectives together.

    Create one with :func:`commlib.init`; derive sub-groups with :meth:`split`. Buffers are NumPy
    arrays or torch CPU tensors, contiguous. Every collective takes ``async_op`` (return a
    :class:`Work` instead of blocking) and, where several algorithms exist, ``algorithm``
    (``"auto"`` by default; see ``commlib.algorithms(collective)``).
    """

    def __init__(self, core, store, prefix: str, rank: int, size: int, timeout: float, split=None,
                 shrink=None, grow=None):
        # ``split``/``shrink``/``grow``: the rendezvous that builds a sub-communicator, the survivors'
        # or the grown communicator (commlib.init passes them), so this module needs no import of
        # the layer that creates communicators.
        self._core = core
        self._split = split
        self._shrink = shrink
        self._shrinks = 0
        self._grow = grow
        self._grows = 0
        # The job a replacement joins (commlib.join(prefix=...)): init()'s prefix, kept by shrink and grow.
        self._job = prefix
        self._addr = _C.core_address(core)  # for _fast; self._core keeps the core alive
        self._store = store
        self._prefix = prefix
        self._rank = rank
        self._size = size
        self._timeout = timeout
        self._splits = 0
        self._lease = None  # init()'s own store, shared with the communicators built over it (hold_store)
        self._device_route = None  # stream engines for device buffers, created on first use
        self._device_calls = None  # its DeviceCallCache's address, for _fast
        self._closed = False
        self._pid = os.getpid()  # a forked child must not close the parent's store server
        # Given back at garbage collection if close() never runs (commlib/core/dropped_close.py).
        self._leftovers = Leftovers()
        self._dropped = weakref.finalize(self, self._leftovers)
        self._dropped.atexit = False  # at exit the process goes, and all of it with it

    def _device(self):
        if self._device_route is None:  # the route reads the communicator only through its RouteContext
            self._device_route = DeviceRoute(RouteContext(core=self._core, store=self._store, prefix=self._prefix,
                                                          rank=self._rank, size=self._size, timeout=self._timeout))
            self._device_calls = self._device_route.fast_calls_address
            self._leftovers.route = self._device_route
        return self._device_route

    # -- identity ---------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank in the communicator (0..size-1)."""
        return self._rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._size

    world_size = size

    @property
    def timeout(self) -> float:
        """Seconds a blocked call waits on a silent peer before raising PeerError."""
        return self._timeout

    @property
    def topology(self):
        """Hosts, the ranks on each, and the link (self/shm/tcp) to every rank: a
        :class:`commlib.bootstrap.hosts.Topology`."""
        from commlib.bootstrap.hosts import Topology

        return Topology(list(self._core.host_names), list(self._core.host_of), list(self._core.link_kinds))

    def __repr__(self):
        return f"Communicator(rank={self._rank}, size={self._size}, prefix={self._prefix!r})"

    # -- helpers ----------------------------------------------------------------------------
    def _check_root(self, root) -> int:
        return as_rank(root, "root", self._size)

    def _check_peer(self, peer, name="peer") -> int:
        peer = as_rank(peer, name, self._size)
        if peer == self._rank:
            raise ValueError(f"{name}: cannot send to or receive from this rank itself ({peer})")
        return peer

    def _run(self, coll, algorithm, in_ptr, out_ptr, count, dtype, op, root, scale, async_op, refs,
             stream=None, compress=None):
        (async_op,) = check_keywords(async_op=async_op)  # (call_checks.py's one table)
        # Device buffers (emulated, CUDA) go to the stream engine: the route forks only here.
        bufs = device_buffers_of(coll, refs)
        if compress is not None or not bufs:
            check_one_sided_on_host(coll, algorithm, compress)
        asked = None if compress is None else (compress, algorithm)  # as given: what the C++ entry keys on
        codec, algorithm = (None, algorithm) if compress is None else compressed_call(  # host and device alike
            self._core, self._size, coll, algorithm, count, dtype, compress)
        if codec is not None and not bufs and stream is None:
            work = run_compressed(self._core, coll, algorithm, in_ptr, out_ptr, count, dtype, op, root, scale, async_op, codec)
            # Checked and resolved: later blocking calls of this key run from the C++ entry
            # (bindings/host_compressed_calls.cc), keyed on compress= and algorithm= as given.
            _C.add_host_compressed(self._addr, int(COLLECTIVE[coll]), asked[1], compress, count, DTYPE[dtype],
                                   codec.name, codec.block_size, codec.rounding, codec.seed, codec.inter_only,
                                   algorithm)
            return Work(work, refs) if async_op else None
        if algorithm == "nccl" and not bufs:
            raise ValueError("algorithm: 'nccl' passes the collective to NCCL and needs device buffers (commlib.emulated arrays or CUDA memory)")
        if bufs:
            return self._device().run(coll, algorithm, bufs, in_ptr, out_ptr, count, dtype, op, root,
                                      scale, async_op, stream, refs, compress=codec, asked=asked)
        if stream is not None:
            raise ValueError("stream: given, but the buffers are host memory")
        work = self._core.run(COLLECTIVE[coll], algorithm, in_ptr, out_ptr, count, DTYPE[dtype], OP[op], root,
                              scale, async_op)
        if async_op:
            return Work(work, refs)
        return None

    # -- collectives --------------------------------------------------------------------------
    def all_reduce(self, tensor, op: str = "sum", algorithm: str = "auto", out=None,
                   async_op: bool = False, scale=None, stream=None, compress=None):
        """Reduce ``tensor`` element-wise over all ranks; every rank gets the result.

        In place unless ``out`` (same dtype and size) is given. ``op`` is one of sum, prod, min,
        max, avg, premul_sum (``scale`` times each input, then sum), band, bor, bxor.
        ``compress``: a codec (:mod:`commlib.codecs`) the messages travel in (docs/compression.md).
        """
        done = _fast(self._addr, _ALL_REDUCE, tensor, out, op, algorithm, 0, async_op, scale, stream, self._device_calls,
                     compress)
        if done is not NotImplemented:
            return done
        ip, n, dt = describe(tensor, "tensor")
        op_ = check_op(op, dt, scale)
        check_algorithm("all_reduce", algorithm)
        op_ptr = ip if out is None else describe_like(out, "out", dt, "tensor", n, f"{n} like tensor")
        return self._run("all_reduce", algorithm, ip, op_ptr, n, dt, op, 0, op_, async_op, (tensor, out),
                         stream, compress)

    def all_gather(self, output, input, algorithm: str = "auto", async_op: bool = False, stream=None,
                   compress=None):
        """Concatenate every rank's ``input`` into ``output`` (size * input elements), rank order.

        ``input`` may be the view of ``output`` at this rank's block (in place). ``compress``: as
        :meth:`all_reduce`'s.
        """
        done = _fast(self._addr, _ALL_GATHER, input, output, "sum", algorithm, 0, async_op, None, stream, self._device_calls,
                     compress)
        if done is not NotImplemented:
            return done
        ip, n, dt = describe(input, "input")
        op_ptr = describe_like(output, "output", dt, "input", _shapes(_C.Collective.all_gather, n, self._size, self._rank, 0)[1],
                                f"size*input = {self._size}*{n}")
        check_algorithm("all_gather", algorithm)
        return self._run("all_gather", algorithm, ip, op_ptr, n, dt, "sum", 0, 1.0, async_op, (input, output),
                         stream, compress)

    def reduce_scatter(self, output, input, op: str = "sum", algorithm: str = "auto",
                       async_op: bool = False, scale=None, stream=None, compress=None):
        """Reduce ``input`` (size * output elements) over ranks; rank r gets block r in ``output``.
        ``compress``: as :meth:`all_reduce`'s."""
        done = _fast(self._addr, _REDUCE_SCATTER, input, output, op, algorithm, 0, async_op, scale, stream, self._device_calls,
                     compress)
        if done is not NotImplemented:
            return done
        op_ptr, n, dt = describe(output, "output")
        ip = describe_like(input, "input", dt, "output", _shapes(_C.Collective.reduce_scatter, n, self._size, self._rank, 0)[0],
                            f"size*output = {self._size}*{n}")
        op_ = check_op(op, dt, scale)
        check_algorithm("reduce_scatter", algorithm)
        return self._run("reduce_scatter", algorithm, ip, op_ptr, n, dt, op, 0, op_, async_op, (input, output),
                         stream, compress)

    def all_to_all(self, output, input, algorithm: str = "auto", async_op: bool = False,
                   output_splits: Optional[Sequence[int]] = None,
                   input_splits: Optional[Sequence[int]] = None, stream=None):
        """Send block j of ``input`` to rank j; block i of ``output`` comes from rank i.

        Equal blocks by default. With ``input_splits``/``output_splits`` (element counts per rank)
        blocks may differ in size (all_to_allv); every rank must agree on what it sends to whom.
        """
        done = _fast(self._addr, _ALL_TO_ALL, input, output, "sum", algorithm, 0, async_op, None, stream,
                     self._device_calls, None, output_splits, input_splits)
        if done is not NotImplemented:
            return done
        async_op, output_splits, input_splits = check_keywords(async_op=async_op, output_splits=output_splits,
                                                               input_splits=input_splits)
        ip, n_in, dt = describe(input, "input")
        op_ptr, n_out, dt2 = describe(output, "output")
        if dt2 != dt:
            raise TypeError(f"output: dtype {dt2} differs from input's {dt}")
        if input_splits is not None or output_splits is not None:
            check_algorithm("all_to_all", algorithm)  # (unused by the batch, but a wrong one is still wrong)
            return self._all_to_allv(output, input, op_ptr, ip, n_out, n_in, dt,
                                     output_splits, input_splits, async_op, stream)
        if n_in != n_out:
            raise ValueError(f"output: has {n_out} elements, input has {n_in}")
        if n_in % self._size:
            raise ValueError(f"input: {n_in} elements do not split evenly over {self._size} ranks "
                             "(pass input_splits/output_splits)")
        check_algorithm("all_to_all", algorithm)
        # In place (input is output) is handled by the core, which sends from a private copy.
        return self._run("all_to_all", algorithm, ip, op_ptr, n_in // self._size, dt, "sum", 0, 1.0,
                         async_op, (input, output), stream)

    def _all_to_allv(self, output, input, op_ptr, ip, n_out, n_in, dt, output_splits, input_splits,
                     async_op, stream):
        ops, own = plan_all_to_allv(self._rank, self._size, ip, op_ptr, n_in, n_out, dt, input_splits,
                                    output_splits)
        bufs = named_device_buffers((("input", input), ("output", output)))
        if bufs:  # the stream engine (commlib/core/device_route.py), this rank's block copied on the stream,
            # the batch numbered as a collective (its errors name all_to_all #n), as the entry's is
            return self._device().p2p(bufs, ops, dt, async_op, (input, output), stream, own, a2av_count=n_in)
        if stream is not None:
            raise ValueError("stream: given, but the buffers are host memory")
        ctypes.memmove(*own)
        # (the batch numbered as a collective: its errors name all_to_all #n, as the entry's do)
        work = self._core.all_to_allv(ops, DTYPE[dt], n_in, async_op)
        return Work(work, (input, output)) if async_op else None

    def broadcast(self, tensor, root: int = 0, algorithm: str = "auto", async_op: bool = False,
                  stream=None):
        """Copy ``tensor`` from ``root`` to every rank (in place)."""
        done = _fast(self._addr, _BROADCAST, tensor, None, "sum", algorithm, root, async_op, None, stream,
                     self._device_calls)
        if done is not NotImplemented:
            return done
        ip, n, dt = describe(tensor, "tensor")
        root = self._check_root(root)
        check_algorithm("broadcast", algorithm)
        return self._run("broadcast", algorithm, ip, ip, n, dt, "sum", root, 1.0, async_op, (tensor,),
                         stream)

    def reduce(self, tensor, root: int = 0, op: str = "sum", algorithm: str = "auto", out=None,
               async_op: bool = False, scale=None, stream=None):
        """Reduce ``tensor`` over all ranks into ``root`` (into ``out`` there if given)."""
        done = _fast(self._addr, _REDUCE, tensor, out, op, algorithm, root, async_op, scale, stream,
                     self._device_calls)
        if done is not NotImplemented:
            return done
        ip, n, dt = describe(tensor, "tensor")
        root = self._check_root(root)
        op_ = check_op(op, dt, scale)
        check_algorithm("reduce", algorithm)
        op_ptr = ip if out is None else describe_like(out, "out", dt, "tensor", n, f"{n} like tensor")
        return self._run("reduce", algorithm, ip, op_ptr, n, dt, op, root, op_, async_op, (tensor, out),
                         stream)

    def gather(self, output, input, root: int = 0, algorithm: str = "auto", async_op: bool = False,
               stream=None):
        """Concatenate every rank's ``input`` into ``output`` on ``root`` (None elsewhere)."""
        done = _fast(self._addr, _GATHER, input, output, "sum", algorithm, root, async_op, None, stream,
                     self._device_calls)
        if done is not NotImplemented:
            return done
        return self._rooted("gather", output, input, root, algorithm, async_op, stream)

    def scatter(self, output, input, root: int = 0, algorithm: str = "auto", async_op: bool = False,
                stream=None):
        """Send block j of ``input`` (on ``root``; None elsewhere) to rank j's ``output``."""
        done = _fast(self._addr, _SCATTER, input, output, "sum", algorithm, root, async_op, None, stream,
                     self._device_calls)
        if done is not NotImplemented:
            return done
        return self._rooted("scatter", output, input, root, algorithm, async_op, stream)

    def _rooted(self, coll, output, input, root, algorithm, async_op, stream):
        """gather and scatter: every rank's block (gather's input, scatter's output) and the root's
        ``size`` blocks (gather's output, scatter's input; checked on the root only)."""
        gathering = coll == "gather"
        block, block_name, whole, whole_name = ((input, "input", output, "output") if gathering
                                                else (output, "output", input, "input"))
        block_ptr, n, dt = describe(block, block_name)
        root = self._check_root(root)
        whole_ptr = 0
        shapes = _shapes(COLLECTIVE[coll], n, self._size, self._rank, root)  # (input elems, output elems, ...)
        whole_elems = shapes[1] if gathering else shapes[0]
        if whole_elems is not None:  # the root
            if whole is None:
                raise ValueError(f"{whole_name}: required on the root rank")
            whole_ptr = describe_like(whole, whole_name, dt, block_name, whole_elems,
                                      f"size*{block_name} = {self._size}*{n}")
        check_algorithm(coll, algorithm)
        ip, op_ptr = (block_ptr, whole_ptr) if gathering else (whole_ptr, block_ptr)
        return self._run(coll, algorithm, ip, op_ptr, n, dt, "sum", root, 1.0, async_op, (input, output),
                         stream)

    def barrier(self, async_op: bool = False, algorithm: str = "auto"):
        """Return once every rank has entered the barrier (``algorithm``: as every collective's)."""
        done = _fast(self._addr, _BARRIER, None, None, "sum", algorithm, 0, async_op, None, None, None)
        if done is not NotImplemented:
            return done
        check_algorithm("barrier", algorithm)
        return self._run("barrier", algorithm, 0, 0, 0, "uint8", "sum", 0, 1.0, async_op, ())
