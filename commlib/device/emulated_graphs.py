"""Stream capture and graphs on the emulated device, with CUDA's rules (``commlib.emulated.graph``,
like ``torch.cuda.graph``)::

    g = emu.Graph()
    with emu.graph(g):             # capture on a side stream made current
        comm.all_reduce(x)         # recorded, not run
    g.replay()                     # runs the recorded work again, with the values captured

While a capture runs, calls CUDA forbids fail as on a GPU (docs/gpu.md, "Stream capture"): in the
default ``"global"`` mode a synchronize, an event query, an allocation (``empty``, ``from_numpy``)
or ``numpy()`` raises ``cudaErrorStreamCaptureUnsupported`` and invalidates the capture, whose end
then raises ``cudaErrorStreamCaptureInvalidated``.
"""
from __future__ import annotations

import contextlib
from typing import Optional

MODES = ("global", "thread_local", "relaxed")


class _Emulated:
    """What this module uses of commlib.device.emulated (Stream, current_stream, use_stream,
    device), installed by it with ``bind`` (emulated imports this module, never the reverse)."""


_api = _Emulated()


def bind(**names) -> None:
    """Called once by commlib.device.emulated with the names above."""
    for k, v in names.items():
        setattr(_api, k, v)


def _emu():
    return _api


def _check_mode(mode, name="capture_error_mode"):
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"{name}: expected one of {', '.join(MODES)}, got {mode!r}")


class Graph:
    """A captured graph (like ``torch.cuda.CUDAGraph``): ``capture_begin``/``capture_end`` (or the
    ``graph`` context manager) record it, ``replay`` launches it on a stream."""

    def __init__(self):
        self._stream = None
        self._exec = None
        self._device = None

    def capture_begin(self, stream=None, capture_error_mode: str = "global") -> None:
        """Begin capturing ``stream``'s work (default: the current stream)."""
        _check_mode(capture_error_mode)
        if self._stream is not None:
            raise RuntimeError("Graph.capture_begin: this graph is already capturing")
        emu = _emu()
        stream = stream or emu.current_stream()
        if not isinstance(stream, emu.Stream):
            raise TypeError(f"stream: expected a commlib.emulated.Stream, got {type(stream).__name__}")
        self._device = emu.device(stream.device_index)
        self._device.begin_capture(stream._stream, capture_error_mode)
        self._stream = stream

    def capture_end(self) -> None:
        """End the capture and instantiate the graph; raises the capture's error (invalidated,
        unjoined) with no graph kept."""
        if self._stream is None:
            raise RuntimeError("Graph.capture_end: this graph is not capturing")
        stream, self._stream = self._stream, None
        graph = self._device.end_capture(stream._stream)
        self._exec = self._device.instantiate(graph)

    def replay(self, stream=None) -> None:
        """Launch the graph on ``stream`` (default: the current stream); returns at once."""
        if self._exec is None:
            raise RuntimeError("Graph.replay: nothing captured (capture it first)")
        stream = stream or _emu().current_stream()
        self._device.launch_graph(self._exec, stream._stream)

    def reset(self) -> None:
        """Drop the instantiated graph (it is destroyed once its launches ran)."""
        self._exec = None


@contextlib.contextmanager
def graph(g: Graph, stream=None, capture_error_mode: str = "global"):
    """Capture the ``with`` block's work into ``g`` on ``stream`` (default: a new side stream),
    made the current stream inside the block, as ``torch.cuda.graph`` does. The capture ends at
    the block's end; an exception inside the block ends it too (its graph discarded) and propagates."""
    if not isinstance(g, Graph):
        raise TypeError(f"g: expected a commlib.emulated.Graph, got {type(g).__name__}")
    _check_mode(capture_error_mode)
    emu = _emu()
    stream = stream or emu.Stream()
    with emu.use_stream(stream):
        g.capture_begin(stream, capture_error_mode)
        try:
            yield g
        except BaseException:
            with contextlib.suppress(RuntimeError):
                g.capture_end()
            g.reset()
            raise
        g.capture_end()


def capture_status(stream=None):
    """``(status, id)`` of ``stream``'s capture (default: the current stream): status "none",
    "active" or "invalidated" (cudaStreamGetCaptureInfo)."""
    emu = _emu()
    stream = stream or emu.current_stream()
    return emu.device(stream.device_index).capture_status(stream._stream)


def is_current_stream_capturing() -> bool:
    """Whether the current stream is capturing (like ``torch.cuda.is_current_stream_capturing``)."""
    return capture_status()[0] != "none"


@contextlib.contextmanager
def capture_mode(mode: str, device_index: Optional[int] = None):
    """This thread's capture interaction mode inside the block (cudaThreadExchangeStreamCaptureMode)."""
    _check_mode(mode, "mode")
    dev = _emu().device(device_index)
    previous = dev.exchange_capture_mode(mode)
    try:
        yield
    finally:
        dev.exchange_capture_mode(previous)
