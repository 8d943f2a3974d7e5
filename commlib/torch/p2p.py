"""Point-to-point for the torch backend: held-back sends and receives issued as commlib batches.

commlib runs the calls of a communicator in FIFO order, while torch issues ``isend``/``irecv`` (and
``batch_isend_irecv``) one operation at a time: ``irecv(p); isend(p)`` on two ranks would deadlock
if each ran as soon as it was issued. Sends and receives are therefore held back and issued together
as concurrent commlib batches when something waits on (or polls) one of their works, or when any
other call is made on the group. A receive without ``src`` finds its sender in the core
(``recv_any``), after the held-back operations. Device tensors (CUDA, emulated) are held back the
same way and go to the stream engine on the group's point-to-point stream (stream_p2p.py).
"""
from __future__ import annotations

import torch
from torch.futures import Future

from commlib.core.call_spec import DTYPE
from commlib.torch.staging import as_flat, out_bytes
from commlib.torch.stream_p2p import (DeviceBatchResult, DeviceHeld, DeviceP2PWork,
                                      device_side, issue_device_batch)
from commlib.torch.work import AnySourceWork, Call, P2PWork


class HostHeld:
    """One held-back send or receive of host bytes; the last of a torch call carries its future
    (``done``: (future, tensors)) and the call's finalizers."""

    __slots__ = ("kind", "buf", "peer", "finals", "done")

    def __init__(self, kind, buf, peer, finals, done):
        self.kind, self.buf, self.peer, self.finals, self.done = kind, buf, peer, finals, done


def _channel(h):
    """Where a held-back operation's messages are matched: the host executor, or a device's engine
    (a host send does not match a device receive; each matches its own kind in call order)."""
    return h.side.key if isinstance(h, DeviceHeld) else "host"


def _rounds(pending):
    """Split held-back operations into batches: the k-th operation of each (channel, kind, peer)
    goes into batch k (a device batch takes at most one send to and one receive from each peer; a
    host batch would take any number, but one rule serves both), so batches run in order keep the
    messages between a pair of ranks in call order. Counting per
    channel matters: a host receive must not be pushed behind a host send into a later batch by
    device operations before it (the host executor runs batches one at a time)."""
    rounds: list = []
    seen: dict = {}
    for h in pending:
        key = (_channel(h), h.kind, h.peer)
        k = seen.get(key, 0)
        seen[key] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(h)
    return rounds


def check_p2p_tensors(kind, tensors):
    """One dense tensor per send or receive, as gloo (and the C++ backend, p2p.cc) take them: a
    ``ValueError`` naming ``tensors`` before anything is held. Sparse tensors are refused: gloo
    refuses them ("input tensor has to be contiguous"), NCCL too, and torch's ``dist.send``/``recv``
    (and so ``batch_isend_irecv``) have no sparse kernel to reach a backend with."""
    if len(tensors) != 1:
        raise ValueError(f"tensors: a {kind} takes one tensor, got {len(tensors)}")
    if getattr(tensors[0], "layout", torch.strided) != torch.strided:  # (emulated device arrays have none)
        raise ValueError(f"tensors: a {kind} of a sparse tensor is not supported, as on gloo and NCCL; move its "
                         "indices() and values() as dense tensors")


class PointToPointMixin:
    """send/recv/recv_anysource of ``ProcessGroupCommlib`` (needs ``_comm``, ``_lock``, ``_p2p``,
    ``_p2p_streams``, ``_completer``)."""

    def _p2p_op(self, kind, tensors, peer):
        tensors = list(tensors)
        check_p2p_tensors(kind, tensors)
        peer = int(peer)
        if not 0 <= peer < self.size() or peer == self.rank():
            raise ValueError(f"{'dst' if kind == 'send' else 'src'}: invalid peer {peer} for "
                             f"rank {self.rank()} of a group of {self.size()}")
        side = device_side(tensors[0])
        if side is not None:
            return self._device_p2p_op(kind, tensors, peer, side)
        fut = Future()
        ops, finals = [], []
        for t in tensors:
            if kind == "send":
                buf = as_flat(t).view(torch.uint8) if t.numel() else None
            else:
                st = out_bytes(t)
                buf = st.buf.view(torch.uint8) if st.buf.numel() else None
                if st.copy:
                    finals.append(st.done)
            if buf is not None:
                ops.append((kind, buf, peer))
        with self._lock:
            for i, (k, buf, p) in enumerate(ops):
                last = i == len(ops) - 1
                self._p2p.append(HostHeld(k, buf, p, finals if last else [],
                                          (fut, tensors) if last else None))
            if not ops:
                fut.set_result(tensors)
        return P2PWork(self, fut)

    def _device_p2p_op(self, kind, tensors, peer, side):
        """Hold back a send/recv of device tensors (all on ``side``'s device): the event recorded
        now on the current stream orders the message after the tensors' producers."""
        t = tensors[0]
        with self._lock:
            stream = self._p2p_streams.get(side)
        result = DeviceBatchResult()
        if kind == "send":
            buf, finals = side.send_bytes(t, stream), []
        else:
            buf, fin = side.recv_bytes(t, stream)
            finals = [fin] if fin is not None else []
        if side.nbytes(buf) == 0:
            result.set()  # nothing to move (zero bytes): complete at once
        else:
            held = DeviceHeld(kind, buf, peer, side, side.record(side.current_stream()), finals, result)
            with self._lock:
                self._p2p.append(held)
        return DeviceP2PWork(self, side, result, tensors)

    def _flush_p2p(self):
        with self._lock:
            self._flush_p2p_locked()

    def _flush_p2p_locked(self):
        """Issue the held-back sends/receives as batches (``_rounds``). Within a batch, host
        operations go to the host executor and each device's to its engine: host and device
        messages of a pair are matched separately, each in call order."""
        pending, self._p2p = self._p2p, []
        if not pending:
            return
        call = Call(None)
        futs = []
        failed = None
        for batch in _rounds(pending):
            host = [h for h in batch if isinstance(h, HostHeld)]
            devices: dict = {}
            for h in batch:
                if isinstance(h, DeviceHeld):
                    devices.setdefault(h.side.key, []).append(h)
            if failed is not None:  # an earlier batch failed to issue: so do the later ones
                for held in devices.values():
                    for h in held:
                        h.result.set(error=failed)
                continue
            try:
                if host:
                    call.works.append(self._comm.batch_p2p([(h.kind, h.buf, h.peer) for h in host],
                                                           async_op=True))
                for held in devices.values():
                    issue_device_batch(self._comm, held, self._p2p_streams.get(held[0].side))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiters
                failed = exc
                for held in devices.values():
                    for h in held:
                        if not h.result.issued:
                            h.result.set(error=exc)
        host_pending = [h for h in pending if isinstance(h, HostHeld)]
        if failed is not None:
            for h in host_pending:
                if h.done is not None:
                    h.done[0].set_exception(failed)
            if call.works:  # wait for what was issued before failing
                self._completer.put(call, [])
            return
        for h in host_pending:
            call.finals.extend(h.finals)
            if h.done is not None:
                futs.append(h.done)
        if host_pending:
            self._completer.put(call, futs)

    def send(self, tensors, dst, tag=0):
        return self._p2p_op("send", tensors, dst)

    def recv(self, tensors, src, tag=0):
        return self._p2p_op("recv", tensors, src)

    def recv_anysource(self, tensors, tag=0):
        """Receive into ``tensors[0]`` from whichever rank sends first (``dist.recv`` without src);
        the returned work's ``_source_rank()`` names it. Asynchronous, after held-back operations."""
        tensors = list(tensors)
        check_p2p_tensors("recv from any source", tensors)
        if device_side(tensors[0]) is not None:
            # The stream engine receives from a named peer only: a message's descriptor is
            # checked against the receive before it moves, so the sender must be known.
            raise ValueError("src: receiving a device tensor from any source is not supported by the "
                             "commlib backend; give src (docs/torch_backend.md)")
        self._flush_p2p()
        t = tensors[0]
        st = out_bytes(t)
        buf = st.buf.view(torch.uint8)
        source = torch.full((1,), -1, dtype=torch.int32)
        core = self._comm._core
        work = core.recv_any(buf.data_ptr(), buf.numel(), DTYPE["uint8"], source.data_ptr(), True)
        call = Call(tensors)
        call.works.append(work)
        if st.copy:
            call.finals.append(st.done)
        call.finals.append(lambda: (buf, source))  # keeps the buffers alive until completion
        fut = Future()
        self._completer.put(call, [(fut, tensors)])
        return AnySourceWork(fut, source)

