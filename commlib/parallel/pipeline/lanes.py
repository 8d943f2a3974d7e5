"""The point-to-point plumbing of a pipeline: lanes, inboxes and the once-per-run shape message.

Activations travel downstream (rank r -> r+1 mod P), gradients upstream. Each direction gets its
own communicators ("lanes", splits of the pipeline communicator), and within a direction a rank
sends on the lane of its colour and receives on its upstream neighbour's, so that no lane ever
carries both a rank's sends and its receives: a send waiting for its receiver never holds up a
receive queued behind it on the same FIFO worker. Neighbours always differ in colour (two colours
for an even ring, a third for the last rank of an odd one).

A receiver knows the order in which its neighbour will send (it builds every rank's action order),
so it posts its receives in that order, one ahead (overlapping the next transfer with compute),
and keeps early arrivals until the action that needs them runs.

On a device (``io`` not None, device_io.py) every inbox and outbox has its own communication
stream, and the lanes' engines are set up once, collectively, by :func:`warm_up`.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Dict, Hashable, List, Sequence, Tuple

import torch

from commlib.device import dtypes

# The shape message's dtype codes: commlib's dtypes, then two the torch layer moves as bytes.
_DTYPES = [*dtypes.torch_dtypes(torch), torch.int16, torch.bool]
META_LEN = 10  # dtype code, ndim, up to 8 dimensions


def colour(rank: int, size: int) -> int:
    if size % 2 == 1 and size > 1 and rank == size - 1:
        return 2
    return rank % 2


def make_lanes(comm) -> Dict[Tuple[str, int], object]:
    """Collective over ``comm``: the communicators {(direction, colour)} (none for one rank)."""
    if comm.size == 1:
        return {}
    n = 3 if comm.size % 2 else 2
    return {(d, c): comm.split(0) for d in ("down", "up") for c in range(n)}


def warm_up(lanes, io) -> None:
    """Collective over every rank of the lanes: one tiny device all_reduce per lane, in one order
    everywhere. A communicator's first device call sets up its stream engine and waits for every
    rank of it; without this, the first send between two stages would wait for a third rank that
    is itself waiting for a message (a pipeline's ranks reach their first device call at
    different times)."""
    for key in sorted(lanes):
        lanes[key].all_reduce(io.zeros((1,), torch.int32))


def message_keys(order, direction: str, num_stages: int, first_step: bool) -> List[Hashable]:
    """The keys of the messages a neighbour running ``order`` sends downstream ("down":
    activations, preceded on the first step by each boundary's shape message) or upstream
    ("up": input gradients), in its order."""
    keys = []
    for a in order:
        if direction == "down" and a.kind == "F" and a.stage + 1 < num_stages:
            if first_step and a.mb == 0:
                keys.append(("meta", a.stage))
            keys.append(("act", a.stage, a.mb))
        elif direction == "up" and a.kind in ("B", "I") and a.stage > 0:
            keys.append(("grad", a.stage - 1, a.mb))
    return keys


def encode_meta(t: torch.Tensor) -> torch.Tensor:
    if t.dim() > META_LEN - 2:
        raise ValueError(f"pipeline activations may have at most {META_LEN - 2} dimensions, got {t.dim()}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"pipeline activations: unsupported dtype {t.dtype}")
    meta = torch.zeros(META_LEN, dtype=torch.int64)
    meta[0], meta[1] = _DTYPES.index(t.dtype), t.dim()
    meta[2:2 + t.dim()] = torch.tensor(t.shape, dtype=torch.int64)
    return meta


def decode_meta(meta: torch.Tensor) -> Tuple[torch.Size, torch.dtype]:
    ndim = int(meta[1])
    return torch.Size(int(x) for x in meta[2:2 + ndim]), _DTYPES[int(meta[0])]


class Inbox:
    """Receives one neighbour's stream of messages on one lane, in the sender's order.

    ``keys`` lists the messages in that order; ``resolve(key)`` gives a key's (shape, dtype), or
    None while unknown (a gradient's shape is learnt from this rank's own first forward, an
    activation's from the shape message that precedes it). ``get(key)`` returns the tensor, waiting
    for it and for any earlier ones. On the host one receive is posted ahead whenever its shape is
    known; on a device each is posted only when ``get`` needs it, so every rank enqueues its
    communication in the schedule's own order: a receive posted ahead makes its stream wait, and
    where streams share a hardware queue (CUDA_DEVICE_MAX_CONNECTIONS) that wait holds up the sends
    queued behind it, which its peer may be waiting for (docs/gpu.md, "Streams sharing hardware
    queues").

    With an ``io`` (device_io.py) the receives run on the inbox's own stream (``stream``, else a
    new one), each after the
    compute issued before it was posted; ``get`` makes the current stream wait for the message
    (the host does not wait) and ``finish`` blocks until every receive ran, raising its error.
    """

    def __init__(self, lane, peer: int, keys: Sequence[Hashable], resolve: Callable, io=None, stream=None):
        self.lane, self.peer, self.resolve, self.io = lane, peer, resolve, io
        self.stream = stream if stream is not None or io is None else io.new_stream()
        self.keys = deque(keys)
        self.posted: deque = deque()
        self.arrived: Dict[Hashable, torch.Tensor] = {}
        self.received: List = []  # device works already waited for (finish checks them)
        self.ahead = io is None
        if self.ahead:
            self._post()

    def _post(self):
        if self.keys and not self.posted:
            spec = self.resolve(self.keys[0])
            if spec is None:
                return
            key = self.keys.popleft()
            if self.io is None:
                buf = torch.empty(spec[0], dtype=spec[1])
                work = self.lane.recv(buf, self.peer, async_op=True)
            else:
                io = self.io
                buf = io.empty(spec[0], spec[1])
                self.stream.wait_event(io.record(io.current_stream()))
                io.use_on(buf, self.stream)
                work = self.lane.recv(buf, self.peer, async_op=True, stream=self.stream)
            self.posted.append((key, buf, work))

    def get(self, key: Hashable) -> torch.Tensor:
        while key not in self.arrived:
            self._post()
            if not self.posted:
                raise RuntimeError(f"pipeline: message {key} is not next from rank {self.peer}")
            k, buf, work = self.posted.popleft()
            work.wait()  # host: blocks; device: orders the current stream after the receive
            if self.io is not None:
                self.received.append(work)
            self.arrived[k] = buf
            if k[0] == "meta":
                self.on_meta(k, buf if self.io is None else self.io.to_host(buf))
            if self.ahead:
                self._post()
        return self.arrived.pop(key)

    def finish(self):
        """End of a step: on a device, block until every receive ran (raises a failed one's
        error, e.g. a peer that died); on the host they already did."""
        works, self.received = self.received, []
        for w in works:
            w.synchronize()

    def on_meta(self, key, buf):  # replaced by the schedule
        pass


class Outbox:
    """Asynchronous sends on one lane; ``flush`` waits for all of them (end of a step).

    With an ``io`` the sends run on the outbox's own stream, each after the compute issued before
    it (which produced the tensor); a host tensor (the shape message) is copied to the device
    first. ``flush`` then makes the current stream wait for the sends and blocks until they ran,
    raising a failed one's error, as the host path's ``flush`` does."""

    def __init__(self, lane, peer: int, io=None, stream=None):
        self.lane, self.peer, self.io = lane, peer, io
        self.stream = stream if stream is not None or io is None else io.new_stream()
        self.works: List = []

    def send(self, t: torch.Tensor):
        if self.io is None:
            self.works.append(self.lane.send(t.contiguous(), self.peer, async_op=True))
            return
        io = self.io
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            t = io.from_host(t)
        t = io.prepare_send(t)
        self.stream.wait_event(io.record(io.current_stream()))
        io.use_on(t, self.stream)
        self.works.append(self.lane.send(t, self.peer, async_op=True, stream=self.stream))

    def flush(self):
        works, self.works = self.works, []
        for w in works:
            w.wait()
        if self.io is not None:
            for w in works:
                w.synchronize()
