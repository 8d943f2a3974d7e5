"""Rank-side scenario of a pipeline's two lanes (issue #23's acceptance), on the emulated device or
on CUDA (torch tensors): activations go forward on one communicator and stream, gradients backward
on another, and every rank posts its gradient receive before its activation send.

Under CUDA's rules this is what hangs a stream engine whose host functions wait for peers (all
host functions of a process run on one thread: a posted-ahead receive blocks the send behind it),
or whose first device call on a communicator blocks the host until every rank makes one there
(rank P-1 starts on the activation lane, the others on the gradient lane).
"""
from __future__ import annotations

import numpy as np


class EmulatedArrays:
    """commlib.emulated arrays and streams."""

    def __init__(self):
        import commlib.emulated as emu
        self.emu = emu

    def stream(self):
        return self.emu.Stream()

    def upload(self, values, stream):
        return self.emu.from_numpy(values, stream=stream)

    def empty(self, n, dtype, stream):
        return self.emu.empty(n, dtype, stream=stream)

    def wait(self, waiter, producer):
        """Later work on ``waiter`` waits for what ``producer`` has so far."""
        waiter.wait_event(producer.record_event())

    def host(self, a, stream):
        stream.synchronize()
        return a.host_view_unsynchronized().copy()


class TorchCudaArrays:
    """torch CUDA tensors and streams (GPU 0: several ranks on one GPU)."""

    def __init__(self):
        import torch
        self.torch = torch
        torch.cuda.set_device(0)

    def stream(self):
        return self.torch.cuda.Stream()

    def upload(self, values, stream):
        with self.torch.cuda.stream(stream):
            return self.torch.from_numpy(values).to("cuda")

    def empty(self, n, dtype, stream):
        with self.torch.cuda.stream(stream):
            return self.torch.full((n,), -1, dtype=getattr(self.torch, dtype), device="cuda")

    def wait(self, waiter, producer):
        waiter.wait_stream(producer)

    def host(self, a, stream):
        stream.synchronize()
        return a.cpu().numpy()


BACKENDS = {"emulated": EmulatedArrays, "cuda": TorchCudaArrays}


def _activation(m, n):
    return (np.arange(n) * 3 + 1000 * m + 7).astype(np.int64)


def _gradient(m, n):
    return (np.arange(n) * 5 - 1000 * m - 11).astype(np.int64)


def two_lanes(comm, backend="emulated", microbatches=3, n=70001, warm=False, order="receive_first"):
    """Activations 0 -> 1 -> ... -> P-1 on lane A, gradients P-1 -> ... -> 0 on lane G (two fresh
    communicators split from ``comm``, each with its own stream). Rank P-1 makes its gradient from
    the activation it received (its gradient stream waits for its activation stream). ``warm``:
    one collective on each lane first, so the lanes' first device calls are not the pattern's.
    ``order``: "receive_first" (the gradient receive posted before the activation send: needs
    the two streams on different hardware queues) or "send_first" (after it: completes on one
    queue, docs/gpu.md). Returns the wrong messages (empty when every one arrived intact)."""
    arrays = BACKENDS[backend]()
    # The lanes' engines are set up here, where every rank is (their first device calls below
    # come in different orders on different ranks).
    device = "cuda:0" if backend == "cuda" else "emulated:0"
    lane_a, lane_g = comm.split(0, device=device), comm.split(0, device=device)
    P, r = comm.size, comm.rank
    sa, sg = arrays.stream(), arrays.stream()
    if warm:
        for lane, s in ((lane_a, sa), (lane_g, sg)):
            x = arrays.upload(np.ones(4, np.int64), s)
            lane.all_reduce(x, stream=s)
    received = []  # (what, buffer, stream, expected)
    def post_gradient_receive(m):
        g = arrays.empty(n, "int64", sg)
        lane_g.recv(g, r + 1, stream=sg)
        received.append((f"gradient {m} from {r + 1}", g, sg, _gradient(m, n)))
        return g

    for m in range(microbatches):
        if r < P - 1 and order == "receive_first":  # the gradient receive, posted ahead
            g = post_gradient_receive(m)
        if r == 0:
            act = arrays.upload(_activation(m, n), sa)
        else:
            act = arrays.empty(n, "int64", sa)
            lane_a.recv(act, r - 1, stream=sa)
            received.append((f"activation {m} from {r - 1}", act, sa, _activation(m, n)))
        if r < P - 1:
            lane_a.send(act, r + 1, stream=sa)
            if order == "send_first":
                g = post_gradient_receive(m)
        if r > 0:
            if r == P - 1:  # the last stage: its gradient after its activation arrived
                arrays.wait(sg, sa)
                g = arrays.upload(_gradient(m, n), sg)
            lane_g.send(g, r - 1, stream=sg)
    bad = []
    for what, buf, stream, want in received:
        got = arrays.host(buf, stream)
        if not np.array_equal(got, want):
            bad.append(f"rank {r}: {what}: {int((got != want).sum())} of {n} elements wrong")
    lane_a.close()
    lane_g.close()
    if backend == "emulated":  # CUDA's rules the emulated device checks: none broken
        rules = arrays.emu.rule_counts()
        if rules["host_function_violations"] or rules["stray_contexts"]:
            bad.append(f"rank {r}: CUDA rules broken: {rules}")
    return bad
