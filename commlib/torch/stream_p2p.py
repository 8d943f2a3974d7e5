"""Point-to-point on device tensors in the Python torch backend (on the C++ backend, commlib._C_torch,
CUDA sends and receives are held and batched in C++: csrc/torch_backend/device_p2p.cc; this path
serves the Python backend alone and what the C++ one hands it): held back like host sends and receives
(p2p.py), then enqueued through the stream engine on the group's own point-to-point stream, as
torch's NCCL process group enqueues its sends and receives on an internal stream.

When ``send``/``recv`` is called, an event is recorded on the caller's current stream, so the
message is ordered after whatever produced (or last used) its tensor. When the held-back operations
are issued, the group's point-to-point stream for that device waits for those events and each
batch is enqueued on it (``Communicator.batch_p2p(..., stream=)``); nothing blocks the host.
``work.wait()`` makes the waiting thread's current stream wait for the batch. The engine runs a
communicator's device calls in call order whatever their streams, so batches keep the order the
host path gives them (p2p.py).

Two kinds of device arrays take this path: torch CUDA tensors, and ``commlib.emulated`` arrays
(which torch cannot hold, but which drive this same layer in CI without a GPU). A ``DeviceSide``
hides the difference: streams, events, byte views and the staging of non-contiguous outputs.
"""
from __future__ import annotations

import torch
from torch.futures import Future

from commlib.torch.staging import as_flat, out_bytes
from commlib.torch.work import Work, timeout_seconds


class CudaSide:
    """Streams, events and buffers of one CUDA device, through torch."""

    def __init__(self, device: torch.device):
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.key = ("cuda", index)

    def current_stream(self):
        return torch.cuda.current_stream(self.device)

    def new_stream(self):
        return torch.cuda.Stream(self.device)

    def record(self, stream):
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def on_stream(self, stream):
        return torch.cuda.stream(stream)

    def nbytes(self, buf):
        return buf.numel() * buf.element_size()

    def send_bytes(self, t, stream):
        """The bytes to send (a contiguous copy made now, on the current stream, if needed)."""
        buf = as_flat(t).view(torch.uint8)
        buf.record_stream(stream)  # used on the p2p stream: the allocator must not reuse it early
        return buf

    def recv_bytes(self, t, stream):
        """(bytes the engine writes, finalizer copying them into ``t`` or None)."""
        st = out_bytes(t)
        buf = st.buf.view(torch.uint8)
        buf.record_stream(stream)  # the finalizer's copy reads it on the p2p stream
        return buf, (st.done if st.copy else None)

    def completed_future(self, result):
        """A CUDA-aware future: its waiters' streams wait for the current stream (as for the
        collectives' StreamWork)."""
        fut = Future(devices=[self.device])
        fut.set_result(result)
        return fut


class EmulatedSide:
    """Streams, events and buffers of one emulated device (``commlib.emulated``)."""

    def __init__(self, device_index: int):
        from commlib.device import emulated
        self._emu = emulated
        self.key = ("emulated", device_index)
        self.index = device_index

    def current_stream(self):
        return self._emu.current_stream(self.index)

    def new_stream(self):
        return self._emu.Stream(self.index)

    def record(self, stream):
        return stream.record_event()

    def on_stream(self, stream):
        return self._emu.use_stream(stream)

    def _bytes(self, a):
        # A byte view sharing the allocation (it keeps the memory alive), so that messages of
        # different dtypes go in one batch, as host messages do.
        return self._emu.Array(a._alloc, a.device_index, a.offset, a.nbytes, "uint8")

    def nbytes(self, buf):
        return buf.nbytes

    def send_bytes(self, a, stream):
        return self._bytes(a)

    def recv_bytes(self, a, stream):
        return self._bytes(a), None  # emulated arrays are always contiguous

    def completed_future(self, result):
        fut = Future()  # torch futures know no emulated device; wait() orders the stream
        fut.set_result(result)
        return fut


def device_side(t):
    """The DeviceSide of ``t`` (a CUDA tensor or an emulated array), or None for host tensors."""
    if isinstance(t, torch.Tensor):
        return CudaSide(t.device) if t.is_cuda else None
    if hasattr(type(t), "__commlib_device__"):
        return EmulatedSide(t.device_index)
    return None


class DeviceBatchResult:
    """What a held-back device operation learns when its batch is issued: the engine's work of
    the batch and an event recorded on the p2p stream after the batch's finalizers, or the error
    that stopped it being issued."""

    __slots__ = ("work", "event", "error", "issued")

    def __init__(self):
        self.work = self.event = self.error = None
        self.issued = False

    def set(self, work=None, event=None, error=None):
        self.work, self.event, self.error, self.issued = work, event, error, True


class DeviceHeld:
    """One held-back send or receive of device bytes: ``buf`` moves after ``event`` (recorded on
    the caller's stream at the call); ``finals`` run on the p2p stream after its batch."""

    __slots__ = ("kind", "buf", "peer", "side", "event", "finals", "result")

    def __init__(self, kind, buf, peer, side, event, finals, result):
        self.kind, self.buf, self.peer = kind, buf, peer
        self.side, self.event, self.finals, self.result = side, event, finals, result


class DeviceStreams:
    """The point-to-point streams of one group, one per device (made on first use)."""

    def __init__(self):
        self._streams = {}

    def get(self, side):
        s = self._streams.get(side.key)
        if s is None:
            s = self._streams[side.key] = side.new_stream()
        return s

    def close(self):
        """Drop the streams (an emulated stream's thread ends with its last reference)."""
        self._streams.clear()


def issue_device_batch(comm, held, stream):
    """Enqueue ``held`` (DeviceHeld of one device, at most one send to and one receive from each
    peer) as one batch on ``stream``, after their callers' events, then their finalizers; tell
    each operation's result. Raises what ``batch_p2p`` raises (after telling the results)."""
    side = held[0].side
    for h in held:
        stream.wait_event(h.event)
    try:
        work = comm.batch_p2p([(h.kind, h.buf, h.peer) for h in held], async_op=True, stream=stream)
    except BaseException as exc:  # noqa: BLE001 - every waiter of the batch gets it
        for h in held:
            h.result.set(error=exc)
        raise
    finals = [f for h in held for f in h.finals]
    if finals:
        with side.on_stream(stream), torch.no_grad():
            for f in finals:
                f()
    done = side.record(stream)  # after the copies back: what wait() orders the waiter after
    for h in held:
        h.result.set(work=work, event=done)


class DeviceP2PWork(Work):
    """Work of a send/recv on device tensors. Waiting on (or polling) it first issues the held-back
    operations; ``wait()`` then makes the current stream wait for the batch (no host blocking) and
    raises the batch's error if it already failed; ``synchronize()`` blocks until it ran."""

    def __init__(self, pg, side, result: DeviceBatchResult, tensors):
        super().__init__(None)
        self._pg, self._side, self._result, self._tensors = pg, side, result, tensors

    def _issued_work(self):
        """The engine's work (None: nothing to move), after issuing; raises a failed issue."""
        if not self._result.issued:
            self._pg._flush_p2p()
        if self._result.error is not None:
            raise self._result.error
        return self._result.work

    def wait(self, timeout=None):
        timeout_seconds(timeout)  # checked like every timeout; the stream waits, not the host
        w = self._issued_work()
        if w is not None:
            e = w.exception()  # None unless it completed with an error
            if e is not None:
                raise e
            self._side.current_stream().wait_event(self._result.event)  # no host blocking
        return True

    def get_future(self):
        self.wait()
        return self._side.completed_future(self._tensors)

    def is_completed(self):
        w = self._issued_work()
        return w is None or (w.is_completed() and (w.exception() is not None or self._result.event.query()))

    def exception(self):
        try:
            w = self._issued_work()
        except Exception as exc:  # noqa: BLE001 - the issue failed
            return exc
        return None if w is None else w.exception()

    def is_success(self):
        return self.is_completed() and self.exception() is None

    def result(self):
        self.wait()
        return self._tensors

    def synchronize(self):
        w = self._issued_work()
        if w is not None:
            w.synchronize()  # raises the batch's error
            self._result.event.synchronize()  # and the copies back ran
