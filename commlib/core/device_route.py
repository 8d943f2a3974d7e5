"""The route from a Communicator to the stream engine (csrc/stream/stream_engine.h).

``Communicator`` sends every call whose buffers are on a device (commlib/device/buffers.py) here,
to one stream engine per (communicator, device), created on the first such call (a collective
step: the ranks exchange their engine handles through the store). The call is enqueued on the
caller's current stream (or ``stream=``) and returns; the buffers are kept alive until the
stream has executed it. Point-to-point calls (send/recv, batches, all_to_all with splits) take the
same route. Host and device calls of a communicator share one call numbering and abort together
(csrc/host/communicator.h). CUDA buffers go to the CUDA device of ``commlib._C_cuda`` (a thin layer
that has never run on a GPU so far). The route sees its communicator only through a
``RouteContext`` (commlib/device/route_context.py).
"""
from __future__ import annotations

import sys

import commlib._C as _C
from commlib.errors import CommError
from commlib.core.call_spec import COLLECTIVE, DTYPE, OP
from commlib.device import nccl_comm as device_nccl
from commlib.device.route_context import RouteContext
from commlib.core.device_close import closed_barrier
from commlib.core.device_work import DeviceWork
from commlib.core.failure import RouteFailure
from commlib.device.buffers import DeviceBuffer


def _cuda_module(name):
    try:
        import commlib._C_cuda as cu
    except ImportError as e:
        raise RuntimeError(f"{name}: is CUDA memory, but commlib._C_cuda is not usable here ({e})") from None
    return cu


def _current_cuda_stream(index) -> int:
    """The caller's current CUDA stream: torch's, else CuPy's, else the legacy default stream, as
    the C++ entry reads it (one reader: the stream a cached call is keyed on is the one it runs on)."""
    _register_stream_readers()
    return _C.current_cuda_stream(index)


def stream_resolver(buf: DeviceBuffer):
    """A function mapping a ``stream=`` argument (None: the current stream) to the engine's
    stream object for buffers like ``buf``."""
    if buf.kind == "emulated":
        from commlib.device import emulated

        def emulated_stream(stream):
            if stream is None:  # the current stream, or the one a __cuda_array_interface__ names
                return emulated.stream_of_handle(buf.device_index, buf.stream)
            if not isinstance(stream, emulated.Stream):
                raise TypeError(f"stream: expected a commlib.emulated.Stream, got {type(stream).__name__}")
            return stream._stream
        return emulated_stream
    cu = _cuda_module("tensor")
    wrapped = {}  # cudaStream_t -> the engine's (non-owning) wrapper: made once per stream, not per call

    def wrap(ptr):
        s = wrapped.get(ptr)
        if s is None:
            if len(wrapped) >= _MAX_CACHED:
                wrapped.clear()
            s = wrapped[ptr] = _C.stream_from_capsule(cu.stream_capsule(buf.device_index, ptr))
        return s

    def cuda_stream(stream):
        if stream is None and buf.stream is not None:  # __cuda_array_interface__'s stream
            ptr = buf.stream
        elif stream is None:
            ptr = _current_cuda_stream(buf.device_index)
        elif hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
            ptr = stream.cuda_stream
        elif hasattr(stream, "ptr"):  # cupy.cuda.Stream
            ptr = stream.ptr
        elif isinstance(stream, int):
            ptr = stream
        else:
            raise TypeError(f"stream: expected a torch.cuda.Stream, CuPy stream or cudaStream_t, "
                            f"got {type(stream).__name__}")
        return wrap(int(ptr))
    return cuda_stream


class DeviceRoute(RouteFailure):
    """The stream engines of one communicator, one per device, and the calls still in flight."""

    def __init__(self, ctx: RouteContext):
        # The communicator's public seam: nothing else of it is read here. A communicator dropped
        # without close() while its works still hold engines is safe: the C++ communicator closes
        # its engines before its transport goes (csrc/host/communicator.h, close listeners).
        self._ctx = ctx
        self._engines = {}
        self._devices = {}
        self._prefixes = {}  # store prefix of each engine's set-up
        self._stream_of = {}  # (kind, index) -> stream resolver (stream_resolver), made once
        self._pools = {}  # (kind, index) -> the symmetric pool (commlib/device/symmetric.py)
        # The resolved calls in C++ (csrc/bindings/device_call_cache.h): the communicator's C++
        # entry (_C.fast_collective) looks a call up there and enqueues it, blocking or async, on
        # the current stream or the one named, with no Python in between. It also holds the buffers
        # of every call of the route (either path) until their stream executed them, and the last
        # engine.
        self._fast_calls = _C.DeviceCallCache(ctx.size, ctx.rank, DeviceWork)
        self.fast_calls_address = self._fast_calls.address()
        # The engines, whoever sets them up: this route, or a C++ caller's first call on a device
        # (the torch backend's, through _C.device_setup_api), by one C++ sequence
        # (csrc/bindings/device_engines.h); NCCL's communicator is the one part left here.
        self._setups = _C.DeviceEngines(ctx.core, ctx.store, ctx.prefix, ctx.timeout, self._fast_calls,
                                        lambda engine, prefix: device_nccl.setup_links(ctx, engine, prefix))

    @property
    def _last_engine(self):
        return self._fast_calls.last_engine

    @_last_engine.setter
    def _last_engine(self, engine):
        self._fast_calls.last_engine = engine

    def setup(self, kind: str, index: int):
        """Set up the engine of device ``kind``:``index`` now (split(device=...)): every rank of
        the communicator is in the same collective call, so the rendezvous waits for nobody's
        first device call."""
        self._engine(DeviceBuffer(kind, 0, 0, "float32", index))

    def symmetric_pool(self, kind: str, index: int):
        """The symmetric pool of device ``kind``:``index`` (commlib/device/symmetric.py), made on first
        use with the device's engine (set up now if it is not: every rank is in the pool's
        collective call), whose registry maps the pool's arenas."""
        key = (kind, index)
        pool = self._pools.get(key)
        if pool is None:
            from commlib.device.symmetric import SymmetricPool
            buf = DeviceBuffer(kind, 0, 0, "float32", index)
            engine = self._engine(buf)
            pool = self._pools[key] = SymmetricPool(kind, index, self._devices[key], engine, stream_resolver(buf))
        return pool

    def _engine(self, buf: DeviceBuffer, first_call=None, first_p2p=None, capture_stream=None):
        """The engine for ``buf``'s device, set up on first use. ``first_call`` (collective,
        algorithm, count, dtype, op, root; collective, dtype and op as the call spec's enums) is
        published while the ranks meet, so a peer in a host call of the same number raises
        MismatchError rather than waiting out the timeout; ``first_p2p`` (items, dtype enum):
        receives whose message a peer sent from a host buffer do."""
        key = (buf.kind, buf.device_index)
        engine = self._engines.get(key)
        if engine is not None:
            return engine
        found = self._setups.find(_BUFFER_KIND[buf.kind], buf.device_index)  # set up by a C++ caller
        if found is None:
            if buf.kind == "emulated":
                from commlib.device import emulated
                device = emulated.device(buf.device_index)
            else:  # CUDA: the thin layer of commlib._C_cuda (never run so far: docs/gpu.md)
                device = _C.device_from_capsule(_cuda_module("tensor").device_capsule(buf.device_index))
            if capture_stream is not None and device.capture_status(capture_stream)[0] != "none":
                raise CommError(f"rank {self._ctx.rank} cannot set up its device engine on {buf.kind}:"
                                f"{buf.device_index} inside a CUDA graph capture (set-up allocates and meets the "
                                "peers, which a capture forbids): run the collectives once outside the capture "
                                "first (the warm-up), then capture them")
            # The set-up is C++ (csrc/bindings/device_engine_setup.h: the engine made, every rank's
            # handle met through the store with the first call's descriptor check, the gone-peer
            # check, the error key and the timeout, COMMLIB_DEVICE_LINK agreed, connect; then NCCL's
            # communicator where some pair uses it); a failure is published under the error key.
            found = self._setups.set_up(_BUFFER_KIND[buf.kind], buf.device_index, device, first_call=first_call,
                                        first_p2p=None if first_call is not None else first_p2p)
        return self._adopt(key, *found)

    def _adopt(self, key, engine, device, prefix):
        """Registers an engine set up (here or by a C++ caller) for device ``key``: any stream and
        shape of the device runs from C++ from now on (bindings/device_p2p_streams.h)."""
        kind, index = key
        self._engines[key] = engine
        self._devices[key] = device
        self._prefixes[key] = prefix
        stream_of = self._stream_of.get(key) or self._stream_of.setdefault(  # (buffers naming no stream)
            key, stream_resolver(DeviceBuffer(kind, 0, 0, "float32", index)))
        self._fast_calls.add_engine(_BUFFER_KIND[kind], index, engine, stream_of,
                                    _cuda_module("tensor").stream_wrapper() if kind == "cuda" else None)
        return engine

    def _adopt_all(self):
        """Adopts the engines C++ callers set up that this route has not seen yet."""
        if len(self._setups) == len(self._engines):
            return
        for kind, index, found in self._setups.engines():
            key = (_KIND_NAME[kind], index)
            if key not in self._engines:
                self._adopt(key, *found)

    def enable_cpp_cuda_setup(self):
        """Lets C++ callers (the torch backend) set up this route's CUDA engines at their first call,
        without this route (a no-op where commlib._C_cuda is not usable)."""
        try:
            import commlib._C_cuda as cu
        except ImportError:
            return
        self._setups.set_cuda(cu.device_maker(), cu.stream_wrapper())

    def run(self, coll, algorithm, bufs, in_ptr, out_ptr, count, dtype, op, root, scale, async_op,
            stream, refs, compress=None, asked=None):
        """Enqueue one collective whose buffers (``bufs``: (argument name, DeviceBuffer)) are on a
        device; return a DeviceWork when ``async_op``. ``compress``: a checked
        :class:`commlib.codecs.Codec` (core/codecs.py ``compressed_call``: ``algorithm`` the one it
        resolved), ``asked`` the caller's (compress=, algorithm=) as given, which the C++ entry keys
        the call on: the messages travel encoded (stream/copy_path_codec.cc)."""
        first, stream_of, device_stream = self._one_device(bufs, stream)
        if algorithm == "nccl" and coll in ("all_reduce", "reduce_scatter", "reduce") and op in ("band", "bor", "bxor"):
            raise ValueError(f"op: NCCL has no {op} (algorithm='nccl')")
        # The call spec (commlib/core/call_spec.py): the names the checks accepted, as enums, once.
        spec = (COLLECTIVE[coll], algorithm, count, DTYPE[dtype], OP[op], root)
        engine = self._engine(first, spec, capture_stream=device_stream)
        if algorithm == "nccl":  # NCCL's own collective: its communicator is made on first use
            device_nccl.ensure_communicator(self._ctx, engine, self._prefixes[(first.kind, first.device_index)],
                                            f"{coll} (nccl, {count} x {dtype}, {op}, root {root})")
        self._after_own_stream(first, stream, stream_of, device_stream)
        args = (spec[0], algorithm, in_ptr, out_ptr, count, spec[3], spec[4], root, scale)
        codec = None if compress is None else (compress.name, compress.block_size, compress.rounding, compress.seed,
                                               compress.inter_only)
        work = engine.run(*args, device_stream) if codec is None else engine.run_compressed(*args, *codec, device_stream)
        self._last_engine = engine
        if first.stream is None and first.kind == "cuda":
            _register_stream_readers()
        # Every argument passed the checks: the C++ entry runs calls of these arguments from now on
        # (a buffer it cannot read, e.g. CuPy's, is simply not added).
        b = refs[1] if len(refs) > 1 else None
        self._fast_calls.add(refs[0], b, op, algorithm if asked is None else asked[1], root,
                             scale if op == "premul_sum" else None, stream, engine, *args, device_stream, stream_of,
                             None if asked is None else asked[0], codec)
        return self._enqueued(work, refs, stream_of, async_op)

    def _one_device(self, bufs, stream):
        """The first buffer, the stream resolver for its device and the call's stream; raises if
        ``bufs`` ((argument name, DeviceBuffer)) are on different devices or ``stream`` is wrong
        (before any engine rendezvous)."""
        first_name, first = bufs[0]
        key = (first.kind, first.device_index)
        for name, b in bufs[1:]:
            if (b.kind, b.device_index) != key:
                raise ValueError(f"{name}: is on {b.kind}:{b.device_index} but {first_name} on "
                                 f"{first.kind}:{first.device_index}")
        stream_of = self._stream_of.get(key) if first.stream is None else None
        if stream_of is None:
            stream_of = stream_resolver(first)
            if first.stream is None:  # a buffer naming its own stream gets its own resolver
                self._stream_of[key] = stream_of
        return first, stream_of, stream_of(stream)

    def _after_own_stream(self, first, stream, stream_of, device_stream):
        """A first buffer naming its own stream (a __cuda_array_interface__'s: its data is valid
        there) in a call on another one (``stream=``): the call's stream waits for that one (an
        event recorded there), as the C++ entry's later calls do (bindings/device_own_stream.cc),
        through an external event node when the call's stream is capturing a graph and that one is not."""
        if first.stream is None or stream is None:
            return
        own = stream_of(None)
        if _C.stream_identity(own) != _C.stream_identity(device_stream):
            device = self._devices[(first.kind, first.device_index)]
            event = device.create_event()
            device.record(event, own)
            # A call captured into a graph while the buffer's stream is not capturing: CUDA refuses
            # a plain wait on an event recorded outside the capture; an external event wait node
            # (the graph holds the event) orders every replay after that stream's work as captured.
            external = (device.capture_status(device_stream)[0] != "none"
                        and device.capture_status(own)[0] == "none")
            device.wait_event(device_stream, event, external=external)

    def last_path(self) -> str:
        """The path the last device collective ran on: "kernel" (one kernel launch over peer
        memory), "copy" (copy-engine copies), "" before the first (COMMLIB_DEVICE_PATH)."""
        return self._last_engine.last_path() if self._last_engine is not None else ""

    def kernel_chunks(self) -> dict:
        """Message chunks (sent and received) the kernel path of the last device collective's
        engine moved so far, by protocol, as its kernels recorded them: ``{"ll": n, "slots": m}``
        (read after the calls completed; zeros before the first)."""
        return self._last_engine.kernel_chunks() if self._last_engine is not None else {"ll": 0, "slots": 0}

    def kernel_trace(self) -> list:
        """COMMLIB_DEVICE_TRACE=1: the last device collective's kernel launch, one ``(block, step,
        start_ns, end_ns)`` per block and step, on the device's clock; ``[]`` when off or before
        the first call. Read it after the call completed (commlib.bench.device_trace)."""
        return self._last_engine.kernel_trace() if self._last_engine is not None else []

    def _start_kernel_chunk_numbers_at(self, n: int) -> None:
        """Test hook: every engine's kernel-path chunk numbers continue from ``n`` (every rank
        the same, between drained calls), to cross the LL flags' epoch (2^32 - 1 chunks)."""
        self._adopt_all()
        if not self._engines:
            raise RuntimeError("no device engine yet: make a device call (or split(device=...)) first")
        for e in self._engines.values():
            e.start_kernel_chunk_numbers_at(n)

    def p2p(self, bufs, items, dtype, async_op, refs, stream, own_block=None, a2av_count=None):
        """Enqueue sends/receives (``items``: (send, address, count, peer)) on device buffers;
        ``own_block`` (dst, src, bytes): a copy enqueued first on the same stream (all_to_all with
        splits: this rank's block to itself); ``a2av_count`` (all_to_all with splits: the elements
        this rank sends): the batch is numbered as that collective, whose errors name
        ``all_to_all #n`` (the engine's ``all_to_allv``, through ``p2p``'s ``a2av_count``), not
        one of its messages."""
        first, stream_of, device_stream = self._one_device(bufs, stream)
        dt = DTYPE[dtype]
        engine = self._engine(first, first_p2p=(items, dt))
        self._after_own_stream(first, stream, stream_of, device_stream)
        if own_block is not None and own_block[2]:
            self._devices[(first.kind, first.device_index)].copy(*own_block, device_stream)
        work = engine.p2p(items, dt, device_stream, a2av_count)
        if stream is None and first.stream is None:  # C++ callers' batches on this stream run there too
            self._fast_calls.add_stream(_BUFFER_KIND[first.kind], first.device_index, engine, device_stream)
        return self._enqueued(work, refs, stream_of, async_op)

    def _enqueued(self, work, refs, stream_of, async_op):
        # Held until executed, polled on every call (one event query): a work held there also holds
        # its completion event, which the engine's pool reuses only once nothing else holds it.
        self._fast_calls.hold(work, refs)
        return DeviceWork(work, refs, stream_of) if async_op else None

    def close(self):
        """Close every engine (never raises for a device error: the engine fails instead), then
        free its memory: the exported inbox only after every rank closed its imports of it (a
        store barrier, bounded by the timeout) and nothing failed (issue #23, item 7). Then raises
        the error of a call that failed without any caller being told (a blocking call that failed
        last: docs/gpu.md, "A mismatched call writes nothing"), once everything is released."""
        self._adopt_all()  # (engines a C++ caller set up close here too)
        engines = list(self._engines.values())
        for key, e in self._engines.items():
            e.close()  # closes its imports of the peers' memory, failed or not
            failed = e.failed()
            # A failed engine frees nothing exported, so it does not wait; it still says it closed
            # its imports, or its healthy peers would wait out the timeout to free theirs.
            peers_closed = closed_barrier(self._ctx, self._prefixes[key], wait=not failed)
            e.release_memory(peers_closed=not failed and peers_closed)
            if key in self._pools:  # its arenas: freed once no peer maps them (the same barrier)
                self._pools.pop(key).close(peers_closed=not failed and peers_closed)
        self._engines.clear()
        self._setups.clear()
        self._fast_calls.clear()  # also forgets the last engine and releases the held buffers
        self._stream_of.clear()
        self._devices.clear()
        for e in engines:
            e.raise_unreported_error()


def _register_stream_readers():
    """Let the C++ entry read torch CUDA tensors and the current CUDA stream (csrc/bindings/buffer_view.cc):
    torch's types (the same registry commlib.torch fills at import) with its current-stream reader
    once torch is imported, else CuPy's current stream (cupy.cuda.get_current_stream(i).ptr)."""
    if _C.torch_cuda_readable():
        return
    torch = sys.modules.get("torch")
    raw_stream = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
    if raw_stream is not None:
        from commlib.device import dtypes
        _C.register_torch_types(torch.Tensor, torch.strided,
                                {t: DTYPE[n] for t, n in dtypes.torch_dtypes(torch).items()}, raw_stream)
    elif "cupy" in sys.modules and _C.cuda_stream_reader() == "":
        _C.register_cuda_stream_reader(sys.modules["cupy"].cuda.get_current_stream, "ptr")


# Streams the route's resolver wraps before it starts over.
_MAX_CACHED = 256
# DeviceBuffer.kind as the C++ cache's BufferKind (bindings/buffer_view.h).
_BUFFER_KIND = {"emulated": 2, "cuda": 3}
_KIND_NAME = {v: k for k, v in _BUFFER_KIND.items()}
