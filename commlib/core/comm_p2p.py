"""A communicator's point-to-point methods: ``send``, ``recv``, ``sendrecv`` and ``batch_p2p``.

A mixin of :class:`commlib.core.communicator.Communicator` (one concept per file): the messages
are planned and checked by commlib/core/p2p_plan.py, then run as one batch of the core (host
buffers) or of the device route's stream engine (device buffers).
"""
from __future__ import annotations

from commlib.core.call_checks import check_keywords, named_device_buffers
from commlib.core.call_spec import DTYPE
from commlib.core.p2p_plan import check_one_per_peer, plan_batch
from commlib.core.work import Work


class PointToPointMethods:
    """Sends and receives of a Communicator (which holds ``_core``, ``_check_peer`` and ``_device``)."""

    def send(self, tensor, peer: int, async_op: bool = False, stream=None):
        """Send ``tensor`` to ``peer``, which must call ``recv`` with the same size and dtype."""
        return self.batch_p2p([("send", tensor, peer)], async_op, stream)

    def recv(self, tensor, peer: int, async_op: bool = False, stream=None):
        """Receive into ``tensor`` from ``peer``."""
        return self.batch_p2p([("recv", tensor, peer)], async_op, stream)

    def sendrecv(self, send_tensor, dst: int, recv_tensor, src: int, async_op: bool = False, stream=None):
        """Send to ``dst`` and receive from ``src`` concurrently (no deadlock in a ring shift)."""
        return self.batch_p2p([("send", send_tensor, dst), ("recv", recv_tensor, src)], async_op, stream)

    def batch_p2p(self, ops, async_op: bool = False, stream=None):
        """Run several sends/receives concurrently: ``ops`` is a list of ("send"|"recv", tensor, peer).

        Host buffers: any number of sends to and receives from each peer; the messages between a
        pair of ranks match in call order (the k-th send to a peer lands in that peer's k-th
        receive from this rank, in this batch and across batches). Device buffers (all of the
        batch) are enqueued on the current stream or ``stream`` like collectives (docs/gpu.md),
        at most one send to and one receive from each peer per batch (the stream engine's limit:
        a ``ValueError`` naming ``ops[i]`` otherwise).
        """
        (async_op,) = check_keywords(async_op=async_op)  # (call_checks.py's one table)
        items, refs, named, dtype = plan_batch(ops, self._check_peer)
        bufs = named_device_buffers(named)
        if bufs:
            check_one_per_peer(items)
            return self._device().p2p(bufs, items, dtype, async_op, refs, stream)
        if stream is not None:
            raise ValueError("stream: given, but the buffers are host memory")
        work = self._core.p2p(items, DTYPE[dtype], async_op)
        return Work(work, refs) if async_op else None
