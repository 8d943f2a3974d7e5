"""Point-to-point for the torch backend: held-back sends and receives issued as commlib batches.

commlib runs the calls of a communicator in FIFO order, while torch issues ``isend``/``irecv`` (and
``batch_isend_irecv``) one operation at a time: ``irecv(p); isend(p)`` on two ranks would deadlock
if each ran as soon as it was issued. Sends and receives are therefore held back and issued together
as concurrent commlib batches when something waits on (or polls) one of their works, or when any
other call is made on the group. A receive without ``src`` finds its sender in the core
(``recv_any``), after the held-back operations.
"""
from __future__ import annotations

import torch
from torch.futures import Future

from commlib.torch.staging import as_flat, out_bytes
from commlib.torch.work import AnySourceWork, Call, P2PWork


class PointToPointMixin:
    """send/recv/recv_anysource of ``ProcessGroupCommlib`` (needs ``_comm``, ``_lock``, ``_p2p``,
    ``_completer``)."""

    def _p2p_op(self, kind, tensors, peer):
        peer = int(peer)
        if not 0 <= peer < self.size() or peer == self.rank():
            raise ValueError(f"{'dst' if kind == 'send' else 'src'}: invalid peer {peer} for "
                             f"rank {self.rank()} of a group of {self.size()}")
        fut = Future()
        tensors = list(tensors)
        ops, finals = [], []
        for t in tensors:
            if kind == "send":
                buf = as_flat(t).view(torch.uint8) if t.numel() else None
                st = None
            else:
                st = out_bytes(t)
                buf = st.buf.view(torch.uint8) if st.buf.numel() else None
                if st.copy:
                    finals.append(st.done)
            if buf is not None:
                ops.append((kind, buf, peer))
        with self._lock:
            for i, op in enumerate(ops):
                last = i == len(ops) - 1
                self._p2p.append((op, finals if last else [], (fut, tensors) if last else None))
            if not ops:
                fut.set_result(tensors)
        return P2PWork(self, fut)

    def _flush_p2p(self):
        with self._lock:
            self._flush_p2p_locked()

    def _flush_p2p_locked(self):
        """Issue the held-back sends/receives. A commlib batch takes at most one send to and one
        receive from each peer, so the k-th operation of each (kind, peer) goes into batch k;
        batches run in order, which keeps messages between a pair of ranks in call order."""
        pending, self._p2p = self._p2p, []
        if not pending:
            return
        rounds: list = []
        seen: dict = {}
        for op, _, _ in pending:
            key = (op[0], op[2])
            k = seen.get(key, 0)
            seen[key] = k + 1
            if k == len(rounds):
                rounds.append([])
            rounds[k].append(op)
        call = Call(None)
        futs = []
        try:
            for batch in rounds:
                call.works.append(self._comm.batch_p2p(batch, async_op=True))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiters
            for _, _, fr in pending:
                if fr is not None:
                    fr[0].set_exception(exc)
            if call.works:  # wait for what was issued before failing
                self._completer.put(call, [])
            return
        for _, finals, fr in pending:
            call.finals.extend(finals)
            if fr is not None:
                futs.append(fr)
        self._completer.put(call, futs)

    @staticmethod
    def _refuse_cuda(tensors, what):
        # Held-back operations are issued later as host batches; the stream engine has no
        # point-to-point yet (docs/gpu.md), so say so now rather than at the flush.
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                raise ValueError(f"tensors: {what} of CUDA tensors is not supported by the commlib "
                                 f"backend yet (collectives are); see docs/torch_backend.md")

    def send(self, tensors, dst, tag=0):
        self._refuse_cuda(tensors, "send")
        return self._p2p_op("send", tensors, dst)

    def recv(self, tensors, src, tag=0):
        self._refuse_cuda(tensors, "recv")
        return self._p2p_op("recv", tensors, src)

    def recv_anysource(self, tensors, tag=0):
        """Receive into ``tensors[0]`` from whichever rank sends first (``dist.recv`` without src);
        the returned work's ``_source_rank()`` names it. Asynchronous, after held-back operations."""
        tensors = list(tensors)
        if len(tensors) != 1:
            raise ValueError(f"tensors: recv from any source takes one tensor, got {len(tensors)}")
        self._refuse_cuda(tensors, "recv")
        self._flush_p2p()
        t = tensors[0]
        st = out_bytes(t)
        buf = st.buf.view(torch.uint8)
        source = torch.full((1,), -1, dtype=torch.int32)
        core = self._comm._core
        work = core.recv_any(buf.data_ptr(), buf.numel(), "uint8", source.data_ptr(), True)
        call = Call(tensors)
        call.works.append(work)
        if st.copy:
            call.finals.append(st.done)
        call.finals.append(lambda: (buf, source))  # keeps the buffers alive until completion
        fut = Future()
        self._completer.put(call, [(fut, tensors)])
        return AnySourceWork(fut, source)

