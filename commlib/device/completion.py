"""An event that completes with a device collective (``DeviceWork.completion_event()``), for code
that needs a CUDA event rather than commlib's own wait: hand ``handle`` (the ``cudaEvent_t``) to a
library that takes one, or make any stream wait with ``wait(stream)``, without blocking the host.

A kernel-path call completes by its done word (docs/gpu.md "The done word"), so it has no event of
its own: asking for one costs, once per ask, a stream wait on the word on the engine's own stream,
an event creation and a record there. ``DeviceWork.wait(stream)`` orders a stream after the call
with the wait on the word alone: prefer it where an event is not needed.
"""
from __future__ import annotations


class CompletionEvent:
    """A device event recorded after a collective; ``_event`` as ``commlib.emulated.Event``'s, so
    ``emulated.Stream.wait_event`` takes it too."""

    __slots__ = ("_device", "_event", "_stream_of")

    def __init__(self, device, event, stream_of):
        self._device = device        # commlib._C.Device of the call's engine
        self._event = event          # commlib._C.DeviceEvent
        self._stream_of = stream_of  # a ``stream=`` argument (None: current) -> the device's stream

    @property
    def handle(self) -> int:
        """The ``cudaEvent_t`` on CUDA (an identity on the emulated device)."""
        return self._event.handle

    def wait(self, stream=None) -> None:
        """Make ``stream`` (default: the current stream of the call's device; a torch or CuPy
        stream, a ``cudaStream_t`` or an emulated stream, as a collective's ``stream=``) wait for
        the call; returns at once."""
        self._device.wait_event(self._stream_of(stream), self._event)

    def query(self) -> bool:
        """Whether the call completed (no wait)."""
        return self._device.query(self._event)

    def synchronize(self) -> None:
        """Block the host until the call completed (its errors are the work's: ``synchronize()``)."""
        self._device.synchronize_event(self._event)

    def __repr__(self):
        return f"CompletionEvent({self._device.name}, handle={self.handle:#x})"
