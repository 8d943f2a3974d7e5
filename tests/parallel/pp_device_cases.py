"""Rank side of test_pipeline_device.py: the pipeline's device message path (lanes.py with an io,
device_io.py's ordering rules) on ``commlib.emulated`` arrays, with the emulated delay on.

torch cannot hold emulated arrays, so the schedules' autograd cannot run here; instead a small
runtime replays every schedule's real action orders (actions.build_orders) and message keys
(lanes.message_keys) through the real Inbox / Outbox / warm_up over the real lanes, with the
"compute" of each action done on the current (compute) stream: the input is read with
``numpy()`` (which waits for the current stream only), the output uploaded with ``from_numpy``
(a delayed operation on the current stream). So:

* a send that did not wait for the compute event would send the upload's stale memory;
* a ``get`` that did not make the compute stream wait for the receive would read it unfinished;
* a receive posted ahead on the compute stream (or on the same stream as a send) would block the
  compute (or the send) behind a message that needs it: a deadlock, caught by the pool's timeout;
* a pipeline set up without ``warm_up`` would stall at its first message between two ranks
  until a third made its first device call on that lane (without ``warm_up``, checked by hand).

The lanes are set up once and shared by every schedule replayed, as a runtime's steps share them.

Values are exact small integers in float64; results are compared for equality with the same
functions run in one process.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from commlib.parallel.pipeline import actions as A
from commlib.parallel.pipeline.lanes import (META_LEN, Inbox, Outbox, colour, decode_meta, encode_meta,
                                             make_lanes, message_keys, warm_up)

_NAMES = {torch.float64: "float64", torch.int64: "int64", torch.int32: "int32"}
_NP = {torch.float64: np.float64, torch.int64: np.int64, torch.int32: np.int32}
IN_LEN = 3  # the first stage's input length; stage s outputs IN_LEN + s + 1 values


class EmulatedIO:
    """device_io's io over commlib.emulated arrays (1-D; shapes are flattened)."""

    def __init__(self, index: int = 0):
        from commlib import emulated
        self.emu, self.index = emulated, index

    def empty(self, shape, dtype):
        return self.emu.empty(int(math.prod(shape)), _NAMES[dtype], self.index)

    def zeros(self, shape, dtype):
        return self.emu.from_numpy(np.zeros(int(math.prod(shape)), _NP[dtype]), self.index)

    def current_stream(self):
        return self.emu.current_stream(self.index)

    def new_stream(self):
        return self.emu.Stream(self.index)

    def record(self, stream):
        return stream.record_event()

    def use_on(self, t, stream):
        # emulated memory is freed in order on the stream that allocated it (the compute stream
        # here), and the communicator holds each buffer until its call executed
        pass

    def to_host(self, a):
        return torch.from_numpy(a.numpy())

    def from_host(self, t):
        return self.emu.from_numpy(t.numpy(), self.index)

    def prepare_send(self, a):
        return a


# -- the replayed model: exact functions of the input ------------------------------------------
def forward_value(stage: int, x: np.ndarray) -> np.ndarray:
    n = IN_LEN + stage + 1
    return np.array([x[k % len(x)] + (stage + 1) * (k + 1) for k in range(n)], np.float64)


def backward_value(stage: int, x_len: int, g: np.ndarray) -> np.ndarray:
    gx = np.zeros(x_len, np.float64)
    for k, v in enumerate(g):
        gx[k % x_len] += v + stage
    return gx


def first_input(step: int, mb: int) -> np.ndarray:
    return np.arange(IN_LEN, dtype=np.float64) + 100 * mb + 1000 * step


def reference(S: int, m: int, step: int):
    """Per micro-batch: the last stage's output and the gradient reaching stage 0's input."""
    outs, grads = {}, {}
    for mb in range(m):
        xs = [first_input(step, mb)]
        for s in range(S):
            xs.append(forward_value(s, xs[-1]))
        outs[mb] = xs[-1]
        g = np.ones(len(xs[-1]))
        for s in reversed(range(S)):
            g = backward_value(s, len(xs[s]), g)
        grads[mb] = g
    return outs, grads


class Replay:
    """One rank of a pipeline replayed on emulated arrays (the schedules' runtime minus autograd)."""

    def __init__(self, comm, kind: str, v: int, m: int, io, lanes):
        self.comm, self.kind, self.m, self.io = comm, kind, m, io
        self.P, self.S = comm.size, comm.size * v
        self.orders = A.build_orders(kind, self.S, self.P, m)
        self.lanes = lanes  # shared by the schedules replayed one after another, as by a runtime's steps
        self.streams = {flow: io.new_stream() for flow in ("down_in", "up_in", "down_out", "up_out")}
        self.shapes = {}

    def step(self, step: int, first: bool):
        r, P, S, io = self.comm.rank, self.P, self.S, self.io
        prev, nxt = (r - 1) % P, (r + 1) % P
        resolve = lambda key: ((META_LEN,), torch.int64) if key[0] == "meta" else self.shapes.get(key[1])  # noqa: E731
        sm = self.streams
        down_in = Inbox(self.lanes[("down", colour(prev, P))], prev,
                        message_keys(self.orders[prev], "down", S, first), resolve, io, sm["down_in"])
        up_in = Inbox(self.lanes[("up", colour(nxt, P))], nxt,
                      message_keys(self.orders[nxt], "up", S, first), resolve, io, sm["up_in"])
        down_in.on_meta = lambda key, buf: self.shapes.__setitem__(key[1], decode_meta(buf))
        down_out = Outbox(self.lanes[("down", colour(r, P))], nxt, io, sm["down_out"])
        up_out = Outbox(self.lanes[("up", colour(r, P))], prev, io, sm["up_out"])
        held, outs, grads = {}, {}, {}
        for a in self.orders[r]:
            st, mb = a.stage, a.mb
            if a.kind == "F":
                if st == 0:
                    x = first_input(step, mb)
                else:
                    x = down_in.get(("act", st - 1, mb)).numpy()  # waits for the compute stream
                y = forward_value(st, x)
                held[(st, mb)] = len(x)
                if st == S - 1:
                    outs[mb] = y
                    continue
                if st not in self.shapes:
                    self.shapes[st] = (torch.Size([len(y)]), torch.float64)
                    down_out.send(encode_meta(torch.empty(len(y), dtype=torch.float64)))
                down_out.send(io.emu.from_numpy(y, io.index))  # an upload on the compute stream
            elif a.kind in ("B", "I"):
                g = np.ones(IN_LEN + st + 1) if st == S - 1 else up_in.get(("grad", st, mb)).numpy()
                gx = backward_value(st, held[(st, mb)], g)
                if st == 0:
                    grads[mb] = gx
                else:
                    up_out.send(io.emu.from_numpy(gx, io.index))
        for box in (down_out, up_out):
            box.flush()
        for box in (down_in, up_in):
            box.finish()
        return outs, grads

    def close(self):
        self.streams = {}


# The replay's own emulated device: created here with its delay and hardware queues, so the test
# runs in the session's plain pools (their ranks have torch imported already) without touching
# device 0 of the other tests.
REPLAY_DEVICE = 5


def replay_device(index: int, delay_us: int, connections: int):
    """Emulated device ``index`` created with ``delay_us`` and ``connections`` (the settings are
    read once, when a process first uses the device)."""
    from commlib import emulated, settings
    with settings.overridden({"COMMLIB_EMULATED_DELAY_US": str(delay_us),
                              "COMMLIB_EMULATED_CONNECTIONS": str(connections)}):
        return emulated.device(index)


def replay_schedules(comm, cases, steps: int = 2, delay_us: int = 20, connections: int = 32) -> list:
    """Replay each (kind, v, m) for ``steps`` steps (the first with shape messages) on emulated
    device REPLAY_DEVICE (created with ``delay_us`` and ``connections`` if this process has not
    used it yet); the list of mismatches against the one-process reference (empty: all equal)."""
    import gc
    import os
    replay_device(REPLAY_DEVICE, delay_us, connections)
    io, fails = EmulatedIO(REPLAY_DEVICE), []
    io.current_stream()  # the default stream's thread lives on
    # One set of lanes for every schedule (setting lanes up was most of a short replay's time),
    # warmed up; the emulated device's process-wide threads (its host-function thread) start there.
    lanes = make_lanes(comm)
    warm_up(lanes, io)
    try:
        io.emu.synchronize(io.index)
        gc.collect()
        threads = len(os.listdir("/proc/self/task"))  # the lanes' engines included: count from here
        fails += _replay_cases(comm, cases, steps, io, lanes)
        io.emu.synchronize(io.index)
        gc.collect()
        left = len(os.listdir("/proc/self/task")) - threads
        if left > 0:
            fails.append(f"{left} threads (streams) outlived the pipelines")
    finally:
        for lane in lanes.values():
            lane.close()
    return fails


def _replay_cases(comm, cases, steps, io, lanes) -> list:
    fails = []
    for kind, v, m in cases:
        rp = Replay(comm, kind, v, m, io, lanes)
        try:
            for step in range(steps):
                outs, grads = rp.step(step, first=step == 0)
                want_out, want_grad = reference(rp.S, m, step)
                if (rp.S - 1) % rp.P == comm.rank:
                    fails += [f"{kind} v={v} m={m} step {step} mb {i}: output {outs.get(i)} != {want_out[i]}"
                              for i in range(m) if not np.array_equal(outs.get(i), want_out[i])]
                if comm.rank == 0:
                    fails += [f"{kind} v={v} m={m} step {step} mb {i}: gradient {grads.get(i)} != {want_grad[i]}"
                              for i in range(m) if not np.array_equal(grads.get(i), want_grad[i])]
        finally:
            rp.close()
    return fails


def replay_on_first_ranks(comm, P: int, cases, **kw) -> list:
    """replay_schedules on a communicator of ranks 0..P-1 of ``comm`` (the others return []), so
    a world size without a pool of its own in the session runs in a larger one."""
    sub = comm.split(0 if comm.rank < P else None)
    if sub is None:
        return []
    try:
        return replay_schedules(sub, cases, **kw)
    finally:
        sub.close()
