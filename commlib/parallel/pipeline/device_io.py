"""How a pipeline on device tensors moves its messages: communication streams and events.

A stage on a CUDA device sends its activations and gradients, and receives its neighbours', on
communication streams of its own, never on the compute stream (torch's current stream):

* a receive is posted before the compute that will consume it has been issued (when its action
  comes, not further ahead: lanes.Inbox says why); enqueued on the compute stream it would hold up
  every kernel behind it until the neighbour sends;
* a send enqueued behind a posted receive on one stream would wait for that receive, which
  may itself wait for this send to reach the neighbour (1F1B's warm-up sends two activations
  before its first gradient arrives): so each of a rank's four message flows (activations in
  and out, gradients in and out) has its stream, as each has its lane (lanes.py). The schedule
  makes the four once, at its set-up, and every step uses them.

The ordering rules, as torch's NCCL process group applies them:

* before a send or a receive is enqueued, its stream waits for an event recorded on the compute
  stream: a send reads what the compute produced, and a receive buffer allocated on the compute
  stream may reuse memory that compute kernels issued earlier still read;
* the compute stream waits for a receive's event before it uses the tensor (``work.wait()`` of a
  device work orders the current stream, it does not block the host);
* each tensor used on a communication stream is marked with ``record_stream`` there, so the
  caching allocator does not hand its memory out again before that stream passed it (the
  communicator also holds a reference until the call executed).

An *io* is the object that knows one device's streams and buffers; ``CudaIO`` is the one the
schedules use. The lanes' code (lanes.py) only calls the methods below, so the tests drive it
with an io over ``commlib.emulated`` arrays (the same stream and event semantics on the host),
which is how this ordering runs in CI: no GPU has ever run ``CudaIO``.
"""
from __future__ import annotations

import torch

__all__ = ["CudaIO", "io_for"]


class CudaIO:
    """Streams, events and buffers of one CUDA device, through torch."""

    def __init__(self, device: torch.device):
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)

    def empty(self, shape, dtype):
        """A receive buffer, allocated on the current (compute) stream."""
        return torch.empty(shape, dtype=dtype, device=self.device)

    def zeros(self, shape, dtype):
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def current_stream(self):
        return torch.cuda.current_stream(self.device)

    def new_stream(self):
        # High priority: torch hands out pooled streams round-robin, and a user's own compute
        # stream normally comes from the default-priority pool, so it is not one of these (a
        # shared stream would put posted receives in front of the compute: see above).
        # Communication ahead of compute is also what NCCL recommends.
        return torch.cuda.Stream(self.device, priority=-1)

    def record(self, stream):
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def use_on(self, t, stream):
        """``t`` will be read or written on ``stream``: the allocator must wait for it."""
        t.record_stream(stream)

    def to_host(self, t):
        """A CPU copy, after the current stream (which waited for the receive) produced ``t``."""
        return t.cpu()

    def from_host(self, t):
        return t.to(self.device)

    def prepare_send(self, t):
        return t.contiguous()


def io_for(device: torch.device):
    """The io of a stage on ``device``: None for the CPU (host messages, the path that never
    involves streams), a CudaIO for a CUDA device."""
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        return CudaIO(device)
    raise ValueError(f"device: pipeline stages run on the CPU or a CUDA device, not {device}")
