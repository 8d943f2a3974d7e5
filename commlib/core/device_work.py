"""The work handle of a call the device route (commlib/core/device_route.py) or the C++ entry
enqueued on a device stream: what ``async_op=True`` returns for device buffers."""
from __future__ import annotations

from commlib.core.call_checks import as_seconds
from commlib.core.work import Work
from commlib.device.completion import CompletionEvent


class DeviceWork(Work):
    """Handle of a call enqueued on a device stream (like torch's NCCL work).

    ``wait()`` makes the current stream (or ``stream``) wait for the call and returns at once;
    ``synchronize()`` blocks the host until the call has executed and raises its CommError;
    ``is_completed()`` polls; ``completion_event()`` gives a CUDA event that completes with it;
    ``exception()`` as for host works.
    """

    __slots__ = ("_stream_of",)

    def __init__(self, work, refs, stream_of):
        super().__init__(work, refs)
        self._stream_of = stream_of  # stream argument (None: current) -> the engine's stream

    def wait(self, timeout=None, stream=None) -> bool:
        as_seconds(timeout, allow_zero=True)  # checked like every timeout; the stream waits, not the host
        self._work.wait(self._stream_of(stream))
        return True

    def synchronize(self):
        self._work.synchronize()
        self._refs = None

    def completion_event(self):
        """A :class:`commlib.device.completion.CompletionEvent` that completes with the call, for
        code that takes a CUDA event (``.handle``) or to order any stream after it
        (``.wait(stream)``) without a host synchronize; None for a call captured in a graph. Each
        ask records one event (the call itself completes by its done word); ``wait(stream=...)``
        orders a stream without one."""
        event = self._work.completion_event()
        return None if event is None else CompletionEvent(self._work.device, event, self._stream_of)

    def _raise_error(self):
        self._work.synchronize()
