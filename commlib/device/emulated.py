"""The emulated device: GPU-style arrays and streams in host memory, for running the GPU engine
without a GPU.

Memory lives in memfds that other ranks' processes map (as CUDA IPC maps a peer's allocation);
every stream is a host thread that executes its queue asynchronously; kernels are the CUDA
kernels' own bodies. Collectives on emulated arrays go through the stream engine exactly as CUDA
tensors do: enqueued on the current stream (or ``stream=``), returning at once::

    import commlib, commlib.device.emulated as emu
    x = emu.from_numpy(np.ones(1000, np.float32))
    comm.all_reduce(x)          # enqueued; returns before the data is ready
    x.numpy()                   # waits for the stream, like tensor.cpu()

Where no device is named, calls use this process's device: ``set_device(index)``, else
``COMMLIB_EMULATED_DEVICE`` (default 0: all local ranks on one device, the several-ranks-per-GPU
case). The emulated NCCL, like NCCL, refuses two ranks on one device: give each rank its own.

The device follows CUDA's documented rules where code could otherwise pass here and hang or fail
on a GPU (docs/gpu.md lists them): one host-function thread per process, no device call inside a
host function, a current device per thread (``rule_counts()``), IPC refusing one's own export,
``inject_fault`` for a sticky device error, and stream capture (``graph``, ``Graph``: CUDA's
capture rules, commlib/device/emulated_graphs.py).
``COMMLIB_EMULATED_DELAY_US`` delays every stream operation, so that missing synchronisation shows
up as wrong data in tests.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading
import weakref
from typing import Optional

import numpy as np

import commlib._C as _C
from commlib.device import dtypes

_state = threading.local()
_defaults: dict = {}
_streams: "weakref.WeakSet[Stream]" = weakref.WeakSet()
_chosen: dict = {}  # "index": the device set_device chose for this process


def set_device(index: int) -> None:
    """This process's device where none is named (as ``torch.cuda.set_device``)."""
    if not isinstance(index, (int, np.integer)) or index < 0:
        raise ValueError(f"index: expected a device index >= 0, got {index!r}")
    _chosen["index"] = int(index)


def current_device() -> int:
    """The device used where none is named: ``set_device``'s, else COMMLIB_EMULATED_DEVICE."""
    if "index" in _chosen:
        return _chosen["index"]
    from commlib import settings
    return int(settings.get("COMMLIB_EMULATED_DEVICE") or 0)


def _index(device_index: Optional[int], stream: Optional["Stream"] = None) -> int:
    if device_index is not None:
        return device_index
    return stream.device_index if stream is not None else current_device()


def device(index: Optional[int] = None):
    """The process's emulated device ``index`` (default: ``current_device()``), a
    ``commlib._C.EmulatedDevice``."""
    return _C.emulated_device(_index(index))


def inject_fault(device_index: Optional[int] = None, kind: str = "illegal_address") -> None:
    """Make emulated device ``device_index`` of this process sticky-failed, like a CUDA context
    after an illegal memory access (``kind``: "illegal_address"): every later call on it raises,
    and work already queued on its streams is skipped. The stream engine turns it into CommError
    on this rank and PeerError on its peers. ``kind="out_of_memory"``: only the next device
    allocation (cudaMalloc's) fails, as cudaErrorMemoryAllocation; nothing sticks."""
    device(device_index).inject_fault(kind)


def rule_counts() -> dict:
    """How often this process broke a CUDA rule that the emulated device checks: device calls
    from a thread that never set a device (``stray_contexts``: on a GPU each creates a context on
    device 0), device or NCCL calls from inside a host function (``host_function_violations``:
    cudaErrorNotPermitted), cudaFree-like frees that had to wait for unfinished stream work
    (``frees_while_busy``: inside an enqueue, a stall or a deadlock on a GPU), exported memory
    freed while a peer still mapped it (``exports_freed_while_mapped``), and the last such call
    (``last_violation``). Also what per-call costs are made of, counted since the process
    started: host functions enqueued (``host_functions``: cudaLaunchHostFunc), events created
    (``events_created``: cudaEventCreate) and events alive now (``events_alive``)."""
    return _C.emulated_rule_counts()


def grid_claims(device_index: Optional[int] = None) -> dict:
    """The device-wide grid budget of emulated device ``device_index`` (issue #38, item 4;
    ``csrc/stream/grid_claims.h``): the kernel path's claims on the device's resident blocks that
    this process made (``claims``), released (``releases``), was refused (``refused``: granted no
    block) and reclaimed from dead processes (``reclaimed``); the shared ledger's entries now
    (``entries``: communicator key, blocks per rank, ranks, live holders, every process's) and its
    /dev/shm name (``ledger``). The device is shared by every process with the same index and
    COMMLIB_EMULATED_MACHINE, as a GPU by the processes using it."""
    return _C.grid_claims(_C.physical_id(device(device_index)))


def residency(device_index: Optional[int] = None) -> tuple:
    """(the /dev/shm name of the ledger of its resident blocks, COMMLIB_EMULATED_RESIDENT_BLOCKS,
    places of dead processes this process reclaimed, the places this process may hold: its MPS
    share where CUDA_MPS_ACTIVE_THREAD_PERCENTAGE was set when the device was made, as an MPS
    client's on a GPU) of emulated device ``device_index``; ('', 0, 0, 0) without a limit. The
    ledger exists only while some block is resident."""
    return _C.emulated_residency(device(device_index))


class Stream:
    """An ordered queue of device work, executed by its own host thread."""

    def __init__(self, device_index: Optional[int] = None):
        self.device_index = _index(device_index)
        self._device = device(self.device_index)
        self._stream = self._device.create_stream()
        _streams.add(self)

    def synchronize(self):
        """Block until everything enqueued so far has executed."""
        self._device.synchronize_stream(self._stream)

    def wait_event(self, event: "Event", external: bool = False):
        """Later work on this stream waits for ``event``'s latest record. ``external``: with
        cudaEventWaitExternal, valid only while this stream is capturing: the graph gets an external
        event wait node, which at each launch waits for the event's latest record as of that launch
        (how a capturing stream may wait on an event recorded outside its capture)."""
        self._device.wait_event(self._stream, event._event, external=external)

    def record_event(self) -> "Event":
        e = Event(self.device_index)
        e.record(self)
        return e

    @property
    def handle(self) -> int:
        """This stream's identity as an integer (as a CuPy stream's ``ptr`` is its cudaStream_t): what
        a ``__cuda_array_interface__`` over emulated memory names as its ``stream`` (the data is
        valid there: a call on it runs there), and what the C++ entry keys calls on this stream by."""
        return _C.stream_identity(self._stream)

    def __repr__(self):
        return f"emulated.Stream(device={self.device_index}, id={id(self):#x})"


class Event:
    """A sequence point on a stream (like torch.cuda.Event)."""

    def __init__(self, device_index: Optional[int] = None):
        self._device = device(device_index)
        self._event = self._device.create_event()

    def record(self, stream: Optional[Stream] = None):
        self._device.record(self._event, (stream or current_stream())._stream)

    def query(self) -> bool:
        return self._device.query(self._event)

    def synchronize(self):
        self._device.synchronize_event(self._event)


def default_stream(device_index: Optional[int] = None) -> Stream:
    device_index = _index(device_index)
    s = _defaults.get(device_index)
    if s is None:
        s = _defaults[device_index] = Stream(device_index)
        # The C++ entry names it by identity 0 (a thread's current stream outside use_stream) and
        # finds it here for a call on a stream the device route has not seen (EmulatedDevice::stream_named).
        s._device.set_default_stream(s._stream)
    return s


def current_stream(device_index: Optional[int] = None) -> Stream:
    """This thread's current stream (the default stream unless inside ``use_stream``)."""
    stack = getattr(_state, "stack", None)
    if stack:
        return stack[-1]
    return default_stream(device_index)


def stream_of_handle(device_index: int, handle: Optional[int]):
    """The engine's stream (a DeviceStream) of the live stream of ``device_index`` whose
    :attr:`Stream.handle` is ``handle`` (0, 1, 2: the default stream), what a
    ``__cuda_array_interface__`` over emulated memory names as its ``stream`` (the reader refused
    one naming no live stream, naming the argument: csrc/bindings/foreign_arrays.cc); None: this
    thread's current stream. ValueError if there is none (it ended since)."""
    if handle is None:
        return current_stream(device_index)._stream
    named = device(device_index).stream_named(0 if handle <= 2 else handle)
    if named is None:
        raise ValueError(f"__cuda_array_interface__'s stream {handle:#x} is no live stream of emulated:{device_index}")
    return named


@contextlib.contextmanager
def use_stream(stream: Stream):
    """Make ``stream`` the current stream of this thread inside the ``with`` block."""
    if not isinstance(stream, Stream):
        raise TypeError(f"stream: expected a commlib.emulated.Stream, got {type(stream).__name__}")
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(stream)
    # The C++ side keys cached device calls on this thread's current stream (the stack's top).
    _C.set_emulated_current_stream(stream._stream)
    try:
        yield stream
    finally:
        stack.pop()
        _C.set_emulated_current_stream(stack[-1]._stream if stack else None)


def synchronize(device_index: Optional[int] = None):
    """Wait for all work on every stream of the device (like torch.cuda.synchronize)."""
    device_index = _index(device_index)
    for s in list(_streams):
        if s.device_index == device_index:
            s.synchronize()


class _Allocation:
    """Owns device memory; freed in stream order on the stream it was allocated on."""

    __slots__ = ("device", "ptr", "stream", "__weakref__")

    def __init__(self, dev, nbytes, stream, shareable=True):
        self.device = dev
        self.ptr = dev.allocate(nbytes) if shareable else dev.allocate_with(nbytes, 0, False)
        self.stream = stream

    def __del__(self):
        try:
            # stream-ordered, as torch's caching allocator (never cudaFree's device-wide sync)
            self.device.free_ordered(self.ptr, self.stream._stream)
        except Exception:  # interpreter shutdown
            pass


class Array:
    """A one-dimensional array in emulated device memory.

    ``numpy()`` waits for the current stream and returns a host copy; slicing with step 1 gives a
    view sharing the memory (e.g. one rank's block of an all_gather output).
    """

    __slots__ = ("_alloc", "device_index", "offset", "count", "dtype", "__weakref__")

    def __init__(self, alloc: _Allocation, device_index: int, offset: int, count: int, dtype: str):
        self._alloc = alloc
        self.device_index = device_index
        self.offset = offset
        self.count = count
        self.dtype = dtype

    @property
    def itemsize(self) -> int:
        return dtypes.SIZE[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    @property
    def shape(self):
        return (self.count,)

    def __len__(self):
        return self.count

    @property
    def __commlib_device__(self):
        """(kind, address, elements, dtype, device index): how commlib/device/buffers.py sees it."""
        return ("emulated", self.data_ptr(), self.count, self.dtype, self.device_index)

    def data_ptr(self) -> int:
        """Device address of the first element."""
        return self._alloc.ptr + self.offset

    def __getitem__(self, key):
        if not isinstance(key, slice):
            raise TypeError("emulated arrays support slices only (a[i:j])")
        start, stop, step = key.indices(self.count)
        if step != 1:
            raise ValueError("emulated arrays support contiguous slices only (step 1)")
        n = max(0, stop - start)
        return Array(self._alloc, self.device_index, self.offset + start * self.itemsize, n, self.dtype)

    def copy_(self, src: "Array", stream: Optional[Stream] = None) -> "Array":
        """Enqueue a device-to-device copy of ``src`` (same dtype and size) into this array."""
        if not isinstance(src, Array) or src.dtype != self.dtype or src.count != self.count:
            raise ValueError("src: must be an emulated array of the same dtype and size")
        s = stream or current_stream(self.device_index)
        device(self.device_index).copy(self.data_ptr(), src.data_ptr(), self.nbytes, s._stream)
        return self

    def numpy(self) -> np.ndarray:
        """A host copy, after the current stream finished all work enqueued so far (bfloat16:
        its uint16 bit patterns)."""
        current_stream(self.device_index).synchronize()
        return self.host_view_unsynchronized().copy()

    def host_view_unsynchronized(self) -> np.ndarray:
        """The memory as it is right now, without waiting for any stream (for tests that prove
        stream order: the data a racing reader would see)."""
        raw = device(self.device_index).read(self.data_ptr(), self.nbytes)
        return np.frombuffer(raw, dtypes.HOST_NUMPY[self.dtype]).copy()

    def __repr__(self):
        return f"emulated.Array(count={self.count}, dtype={self.dtype}, device={self.device_index})"


def empty(count: int, dtype: str = "float32", device_index: Optional[int] = None,
          stream: Optional[Stream] = None, shareable: bool = True) -> Array:
    """An uninitialised array of ``count`` elements of ``dtype`` (one of commlib.DTYPES), on
    ``device_index`` (default: ``stream``'s device, else ``current_device()``). ``shareable=False``:
    memory without a shareable handle, as a VMM allocation without one or a cudaMallocAsync / CuPy
    pool's (peers cannot map it: one-sided calls stage it, docs/gpu.md "One-sided plans")."""
    device_index = _index(device_index, stream)
    if not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"count: must be a non-negative integer, got {count!r}")
    if dtype not in dtypes.SIZE:
        raise TypeError(f"dtype: unsupported {dtype!r} (supported: {', '.join(dtypes.NAMES)})")
    s = stream or current_stream(device_index)
    alloc = _Allocation(device(device_index), int(count) * dtypes.SIZE[dtype], s, shareable)
    return Array(alloc, device_index, 0, int(count), dtype)


def from_numpy(a, device_index: Optional[int] = None, stream: Optional[Stream] = None,
               dtype: Optional[str] = None, shareable: bool = True) -> Array:
    """A device copy of a host array (NumPy, or a torch CPU tensor, bfloat16 included), uploaded
    asynchronously on ``stream`` (default: the current stream). ``dtype="bfloat16"`` takes a
    NumPy uint16 array of bfloat16 bit patterns (NumPy has no bfloat16). ``shareable``: as
    :func:`empty`'s."""
    from commlib.device.host_buffers import describe
    if dtype == "bfloat16" and isinstance(a, np.ndarray) and a.dtype == np.uint16:
        a = np.ascontiguousarray(a)
        ptr, n, dt = a.ctypes.data, a.size, "bfloat16"
    elif dtype is not None:
        raise ValueError("dtype: only 'bfloat16' (from uint16 bit patterns) may be given")
    else:
        ptr, n, dt = describe(a, "a")
    device_index = _index(device_index, stream)
    s = stream or current_stream(device_index)
    out = empty(n, dt, device_index, s, shareable)
    data = ctypes.string_at(ptr, out.nbytes) if out.nbytes else b""
    device(device_index).upload(out.data_ptr(), data, s._stream)
    return out


# Stream capture and graphs (emulated_graphs.py), as commlib.emulated.graph and the rest.
from commlib.device import emulated_graphs as _graphs  # noqa: E402
from commlib.device.emulated_graphs import (  # noqa: E402,F401
    Graph, capture_mode, capture_status, graph, is_current_stream_capturing)

_graphs.bind(Stream=Stream, current_stream=current_stream, use_stream=use_stream, device=device)

# The C++ entry's buffer reader (csrc/bindings/buffer_view.cc) reads Array's slots itself.
_C.register_emulated_array(Array, {name: getattr(_C.DType, name) for name in dtypes.NAMES})
# ... and a call's stream= on the emulated device (csrc/bindings/named_stream.cc): Stream's _stream.
_C.register_emulated_stream(Stream)


def kernel_counters(reset: bool = False) -> dict:
    """What the emulated device counted of the kernel path's launches in this process
    (csrc/kernels/plan_atomics.cuh, EmuCounter). Of one-sided launches: data bytes loaded and stored (``bytes_read``,
    ``bytes_written``; a reduction loads both operands), the staged path's copies in and out
    (``staged_bytes``, loaded + stored), system-scope fences of signals and waits
    (``system_fences``), waits completed (``handshakes``), grid barriers per block
    (``grid_barriers``), blocks run (``block_runs``), host-memory words read and written
    (``host_reads``; ``host_writes``: progress and completion words; of message plans too) and
    those touched while a data item ran (``host_data_accesses``); the reads of the abort word inside
    waits, every plan's (``abort_polls``, each a host read too: ``host_reads - abort_polls`` are the
    other reads, none today). Of message plans' launches (issue #37):
    launches and their blocks (``message_launches``, ``message_blocks``), waits on a word a peer
    writes (``peer_waits``: a chunk's gate or LL lines, a peer's call descriptor), descriptor checks
    run as an exchange before the first step (``check_exchanges``) and peers' descriptors compared
    inside the data handshakes instead (``folded_checks``); grid barriers of both kinds.
    ``reset``: zero them after reading."""
    return _C.emulated_kernel_counters(reset)
