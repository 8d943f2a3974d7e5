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
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Dict, Hashable, List, Sequence, Tuple

import torch

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.uint8, torch.int8, torch.int16, torch.bool]
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
    for it and for any earlier ones; one receive is posted ahead whenever its shape is known.
    """

    def __init__(self, lane, peer: int, keys: Sequence[Hashable], resolve: Callable):
        self.lane, self.peer, self.resolve = lane, peer, resolve
        self.keys = deque(keys)
        self.posted: deque = deque()
        self.arrived: Dict[Hashable, torch.Tensor] = {}
        self._post()

    def _post(self):
        if self.keys and not self.posted:
            spec = self.resolve(self.keys[0])
            if spec is None:
                return
            key = self.keys.popleft()
            buf = torch.empty(spec[0], dtype=spec[1])
            self.posted.append((key, buf, self.lane.recv(buf, self.peer, async_op=True)))

    def get(self, key: Hashable) -> torch.Tensor:
        while key not in self.arrived:
            self._post()
            if not self.posted:
                raise RuntimeError(f"pipeline: message {key} is not next from rank {self.peer}")
            k, buf, work = self.posted.popleft()
            work.wait()
            self.arrived[k] = buf
            if k[0] == "meta":
                self.on_meta(k, buf)
            self._post()
        return self.arrived.pop(key)

    def on_meta(self, key, buf):  # replaced by the schedule
        pass


class Outbox:
    """Asynchronous sends on one lane; ``flush`` waits for all of them (end of a step)."""

    def __init__(self, lane, peer: int):
        self.lane, self.peer = lane, peer
        self.works: List = []

    def send(self, t: torch.Tensor):
        self.works.append(self.lane.send(t.contiguous(), self.peer, async_op=True))

    def flush(self):
        works, self.works = self.works, []
        for w in works:
            w.wait()
