"""CUDA tensors in the torch backend: calls ordered on the caller's current stream, as torch's NCCL
process group orders them.

A call on CUDA tensors goes to the communicator's device path (commlib/core/device_route.py: the stream
engine on ``torch.cuda.current_stream()``), which only enqueues; the call's finalizers (copies out of
staging buffers) are enqueued right after it on the same stream. Nothing waits on the host: the
returned ``StreamWork`` holds a CUDA-aware ``torch.futures.Future`` completed at once, whose
``wait()`` makes the *waiting* thread's current stream wait for the call (an event recorded on
the issuing stream), exactly what ``ProcessGroupNCCL``'s work does. DDP's reducer and FSDP2 read
results through that future, so their later kernels are ordered after the collective.
"""
from __future__ import annotations

import torch
from torch.futures import Future

from commlib.torch.work import Work, timeout_seconds


def cuda_device(tensors):
    """The device of the first tensor in ``tensors`` (nested lists allowed) when it is a CUDA
    tensor; None when it is a host tensor or there is none (the host path then)."""
    for x in tensors:
        if isinstance(x, (list, tuple)):
            if x:
                return cuda_device(x)
            continue
        if isinstance(x, torch.Tensor):
            return x.device if x.is_cuda else None
    return None


class StreamWork(Work):
    """Work of a call enqueued on a CUDA stream (the future's value: the output tensors).

    ``wait()`` makes the current stream wait for the call and returns without blocking the host,
    and raises if an enqueued call of this work has already failed (a failed stream engine also
    fails every later call at once); ``is_completed()`` polls the device; ``synchronize()``
    blocks the host until the call ran and raises its error.
    """

    def __init__(self, result, device, device_works):
        fut = Future(devices=[device])
        fut.set_result(result)  # records an event on the current stream of ``device``
        super().__init__(fut)
        self._device_works = device_works

    def _raise_failed(self):
        for w in self._device_works:
            e = w.exception()  # None unless completed with an error
            if e is not None:
                raise e

    def wait(self, timeout=None):
        timeout_seconds(timeout)  # checked like every timeout; the stream waits, not the host
        self._raise_failed()
        self._fut.wait()  # the current stream waits for the event: no host synchronisation
        return True

    def get_future(self):
        # Completed at once with the outputs (errors surface through wait()/exception()); its
        # CUDA event is what orders the reader's stream, so it is handed out as it is.
        return self._fut

    def is_completed(self):
        return all(w.is_completed() for w in self._device_works)

    def exception(self):
        for w in self._device_works:
            e = w.exception()
            if e is not None:
                return e
        return None

    def is_success(self):
        return self.is_completed() and self.exception() is None

    def synchronize(self):
        for w in self._device_works:
            w.synchronize()
