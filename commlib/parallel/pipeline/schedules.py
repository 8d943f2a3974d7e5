"""Pipeline schedules: GPipe, 1F1B, interleaved (looping) 1F1B and zero-bubble (ZB-H1).

Every schedule is the same runtime following different action orders (:mod:`.actions`): each
rank runs its list in order; a forward's output goes downstream with an asynchronous send, a
backward's input gradient upstream; receives are posted ahead (:mod:`.lanes`). The user-facing
shape is ``torch.distributed.pipelining``'s:

    sched = Schedule1F1B(stage, n_microbatches=8, loss_fn=loss_fn)
    sched.step(x)                              # first stage: the whole batch
    sched.step(target=y, losses=losses)        # last stage: targets; per-micro-batch losses
    sched.step()                               # middle stages

Gradients accumulate into ``.grad`` over the micro-batches of a step (call ``zero_grad`` between
steps, as without a pipeline); each micro-batch's loss is divided by ``n_microbatches`` before its
backward, so a ``loss_fn`` returning a micro-batch mean gives the whole batch's mean gradient.

Stages on a CUDA device (every rank's, one device per rank) compute on torch's current stream
and move their messages on communication streams of their own (device_io.py); the orders, and
so every schedule, are the same as on the CPU.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch

from commlib.parallel.pipeline import actions as A
from commlib.parallel.pipeline.device_io import io_for
from commlib.parallel.pipeline.lanes import (META_LEN, Inbox, Outbox, colour, decode_meta, encode_meta, make_lanes,
                                             message_keys, warm_up)
from commlib.parallel.pipeline.split_backward import Recorder, backward_input, backward_weight, param_owners
from commlib.parallel.pipeline.stage import PipelineStage, same_device

__all__ = ["ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleZeroBubble"]

# Errors found before anything is sent, exchanged at the first step so that every rank raises.
_DEVICE_KINDS = ("cpu", "cuda")  # the stage devices a pipeline runs on (PipelineStage checks)
_ERRORS = {1: "loss_fn is None on the rank holding the last stage",
           2: "the first stage's batch does not split into n_microbatches equal micro-batches",
           3: "the last stage's target does not split into n_microbatches equal micro-batches",
           4: "the first stage got no input (call step(x) there)",
           5: "the last stage got no target (call step(target=y) there)"}


class _PipelineSchedule:
    kind = ""

    def __init__(self, stages: Union[PipelineStage, Sequence[PipelineStage]], n_microbatches: int,
                 loss_fn: Optional[Callable] = None):
        stages = [stages] if isinstance(stages, PipelineStage) else list(stages)
        if not stages:
            raise ValueError("stages: empty")
        if not isinstance(n_microbatches, int) or n_microbatches < 1:
            raise ValueError(f"n_microbatches: must be a positive int, got {n_microbatches!r}")
        comm, S = stages[0].comm, stages[0].num_stages
        for st in stages:
            if st.comm is not comm or st.num_stages != S:
                raise ValueError("stages: all of a rank's stages must share comm and num_stages")
            if not same_device(st.device, stages[0].device):
                raise ValueError(f"stages: stage {st.stage_index} is on {st.device} but stage "
                                 f"{stages[0].stage_index} on {stages[0].device}; a rank's stages share one device")
        P = comm.size
        mine = sorted(st.stage_index for st in stages)
        if mine != list(range(comm.rank, S, P)):
            raise ValueError(f"stages: rank {comm.rank} must hold stages {list(range(comm.rank, S, P))} "
                             f"(stage s on rank s % {P}), got {mine}")
        self.stages: Dict[int, PipelineStage] = {st.stage_index: st for st in stages}
        self.comm, self.S, self.P, self.m = comm, S, P, n_microbatches
        self.loss_fn = loss_fn
        self.device = stages[0].device
        self.io = None                       # device stages: their streams and buffers (device_io)
        self.streams: dict = {}              # device stages: the stream of each message flow
        self.timeline: List[dict] = []       # the last step's compute actions (see timeline.py)
        self.stats: dict = {}                # the last step's activation memory
        self._ready = False
        self._steps = 0
        self._broken = None
        self.lanes: dict = {}
        self._shapes: Dict[int, tuple] = {}  # stage boundary b (output of stage b) -> (shape, dtype)
        self._owners: Dict[int, object] = {}  # zero bubble: stage -> parameter owners (split_backward)

    # -- set-up, once -------------------------------------------------------------------------
    def _agree(self, err: int):
        """All ranks exchange (S, m, kind, device type, error) and raise the same error if any
        differ; then make the lanes (and, on a device, set up their engines together)."""
        kinds = A.KINDS.index(self.kind)
        device_kind = _DEVICE_KINDS.index(self.device.type)
        mine = torch.tensor([self.S, self.m, kinds, device_kind, err], dtype=torch.int64)
        every = torch.empty(5 * self.P, dtype=torch.int64)
        self.comm.all_gather(every, mine)
        rows = every.view(self.P, 5).tolist()
        for what, col, names in (("num_stages", 0, None), ("n_microbatches", 1, None), ("schedule", 2, A.KINDS),
                                 ("stage device", 3, _DEVICE_KINDS)):
            vals = [r[col] for r in rows]
            if len(set(vals)) > 1:
                shown = [names[v] for v in vals] if names else vals
                raise ValueError(f"{what} disagrees between the pipeline's ranks: {shown} (rank order)")
        bad = {r: _ERRORS[row[4]] for r, row in enumerate(rows) if row[4]}
        if bad:
            raise ValueError("pipeline set-up failed: " + "; ".join(f"rank {r}: {e}" for r, e in bad.items()))
        self.lanes = make_lanes(self.comm)
        self.io = io_for(self.device)
        if self.io is not None and self.lanes:
            warm_up(self.lanes, self.io)
            self.streams = {flow: self.io.new_stream() for flow in ("down_in", "up_in", "down_out", "up_out")}
        self.orders = A.build_orders(self.kind, self.S, self.P, self.m)
        self._ready = True

    def _local_error(self, x, target) -> int:
        has_last = (self.S - 1) in self.stages
        if has_last and self.loss_fn is None:
            return 1
        if 0 in self.stages:
            if x is None:
                return 4
            if x.shape[0] % self.m:
                return 2
        if has_last:
            if target is None:
                return 5
            if target.shape[0] % self.m:
                return 3
        return 0

    # -- one step -------------------------------------------------------------------------------
    def step(self, *args, target=None, losses: Optional[list] = None):
        """Run one training step's forwards and backwards over ``n_microbatches`` micro-batches.

        First stage: ``step(x)``; last stage: ``step(target=y, losses=[...])`` (appends each
        micro-batch's loss, unscaled); returns the last stage's outputs concatenated (else None).
        """
        if self._broken:
            raise RuntimeError(f"pipeline schedule is unusable: {self._broken}; build a new one")
        x = args[0] if args else None
        err = self._local_error(x, target)
        if not self._ready:
            self._agree(err)
        elif err:
            raise ValueError(f"pipeline step: {_ERRORS[err]} (rank {self.comm.rank})")
        if self.io is not None and any(st == self.io.current_stream() for st in self.streams.values()):
            # posted-ahead receives would sit in front of the compute: a hang, so refuse
            raise ValueError("pipeline step: torch's current stream is one of the pipeline's communication "
                             "streams; compute on another stream")
        first_step = self._steps == 0
        inputs = list(torch.tensor_split(x, self.m)) if 0 in self.stages else None
        targets = list(torch.tensor_split(target, self.m)) if (self.S - 1) in self.stages else None
        run = _StepRun(self, inputs, targets, first_step)
        try:
            outputs, step_losses = run.execute()
        except BaseException as exc:
            # A half-run step cannot be resumed: abort the lanes, so that the neighbours waiting on
            # this rank fail at once with its reason instead of at the timeout, and so that no
            # receive can still write into this step's buffers.
            for lane in self.lanes.values():
                lane.abort(f"pipeline step failed on rank {self.comm.rank} of the pipeline: "
                           f"{type(exc).__name__}: {exc}")
            self._broken = f"an earlier step failed ({type(exc).__name__}: {exc})"
            raise
        self._steps += 1
        if losses is not None:
            losses.extend(step_losses)
        return torch.cat(outputs) if outputs else None

    def close(self):
        """Release the lanes (communicators split from the pipeline communicator)."""
        for lane in self.lanes.values():
            lane.close()
        self.lanes, self.streams = {}, {}
        self._ready = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _StepRun:
    """The state of one step on one rank: inboxes, outboxes, held activations."""

    def __init__(self, sched: _PipelineSchedule, inputs, targets, first_step: bool):
        self.s, self.inputs, self.targets, self.first = sched, inputs, targets, first_step
        r, P = sched.comm.rank, sched.P
        self.held: Dict[tuple, tuple] = {}    # (stage, mb) -> (input, output-or-loss, grad_output)
        self.local: Dict[tuple, torch.Tensor] = {}  # same-rank hand-offs (one-rank pipelines)
        self.outputs, self.losses = [], {}
        self.live_bytes = self.peak_bytes = 0
        self.act_bytes: Dict[tuple, int] = {}
        self.split: Dict[tuple, list] = {}     # zero bubble: (stage, mb) -> [Recorder, owner grads]
        self.boxes = []
        if P > 1:
            prev, nxt = (r - 1) % P, (r + 1) % P
            lanes = sched.lanes
            io, S, streams = sched.io, sched.S, sched.streams
            self.down_in = Inbox(lanes[("down", colour(prev, P))], prev,
                                 message_keys(sched.orders[prev], "down", S, first_step), self._resolve, io,
                                 streams.get("down_in"))
            self.up_in = Inbox(lanes[("up", colour(nxt, P))], nxt,
                               message_keys(sched.orders[nxt], "up", S, first_step), self._resolve, io,
                               streams.get("up_in"))
            self.down_in.on_meta = self._on_meta
            self.down_out = Outbox(lanes[("down", colour(r, P))], nxt, io, streams.get("down_out"))
            self.up_out = Outbox(lanes[("up", colour(r, P))], prev, io, streams.get("up_out"))
            self.boxes = [self.down_in, self.up_in, self.down_out, self.up_out]

    def _resolve(self, key):
        if key[0] == "meta":
            return (META_LEN,), torch.int64
        return self.s._shapes.get(key[1])

    def _on_meta(self, key, buf):
        self.s._shapes[key[1]] = decode_meta(buf)

    # -- actions --------------------------------------------------------------------------------
    def execute(self):
        s = self.s
        t_begin = time.perf_counter()
        s.timeline = []
        for a in s.orders[s.comm.rank]:
            self.t_compute = None
            t0 = time.perf_counter()
            getattr(self, "_" + a.kind)(a.stage, a.mb)
            # the action's compute starts once its input arrived: waiting is bubble, not work
            s.timeline.append({"rank": s.comm.rank, "kind": a.kind, "stage": a.stage, "mb": a.mb,
                               "start": self.t_compute or t0, "end": time.perf_counter()})
        for box in self.boxes:
            if isinstance(box, Outbox):
                box.flush()
            else:
                box.finish()
        s.stats = {"peak_activation_bytes": self.peak_bytes,
                   "activation_bytes_per_microbatch": max(self.act_bytes.values(), default=0),
                   "peak_in_flight": A.peak_in_flight([s.orders[s.comm.rank]])[0],
                   "step_start": t_begin, "step_end": time.perf_counter()}
        return self.outputs, [self.losses[i] for i in sorted(self.losses)]

    def _F(self, st: int, mb: int):
        s, stage = self.s, self.s.stages[st]
        if st == 0:
            x = self.inputs[mb]
        else:
            x = self.local.pop(("act", st - 1, mb)) if s.P == 1 else self.down_in.get(("act", st - 1, mb))
            x = x.detach().requires_grad_(torch.is_floating_point(x))
        self.t_compute = time.perf_counter()
        saved = {}
        params = {p.untyped_storage().data_ptr() for p in stage.module.parameters()}

        def pack(t):  # activation memory: tensors saved for backward, parameters excluded
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:  # a view (the first stage's micro-batch) counts its own bytes
                saved[ptr] = max(saved.get(ptr, 0), t.numel() * t.element_size())
            return t

        rec = None
        if s.kind == "zero_bubble":
            if st not in s._owners:
                s._owners[st] = param_owners(stage.module)
            rec = Recorder(s._owners[st]) if s._owners[st] else None
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), (rec or contextlib.nullcontext()):
            out = stage.module(x)
            if stage.is_last:
                loss = s.loss_fn(out, self.targets[mb])
        if rec is not None:
            self.split[(st, mb)] = [rec if rec.complete() else None, None]
        self.act_bytes[(st, mb)] = sum(saved.values())
        self.live_bytes += self.act_bytes[(st, mb)]
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        if stage.is_last:
            self.losses[mb] = loss.detach()
            self.outputs.append(out.detach())
            self.held[(st, mb)] = (x, loss / s.m, None)
            return
        self.held[(st, mb)] = (x, out, None)
        known = s._shapes.get(st)
        if known is None:
            s._shapes[st] = (out.shape, out.dtype)
            if s.P > 1:
                self.down_out.send(encode_meta(out))
        elif (out.shape, out.dtype) != known:
            raise ValueError(f"stage {st} output of micro-batch {mb} has shape {tuple(out.shape)} {out.dtype}; "
                             f"the pipeline agreed {tuple(known[0])} {known[1]} at its first step")
        if s.P > 1:
            self.down_out.send(out.detach())
        else:
            self.local[("act", st, mb)] = out.detach()

    def _grad_out(self, st: int, mb: int):
        if self.s.stages[st].is_last:
            return None
        key = ("grad", st, mb)
        g = self.local.pop(key) if self.s.P == 1 else self.up_in.get(key)
        self.t_compute = time.perf_counter()
        return g

    def _send_input_grad(self, st: int, mb: int, g):
        if st == 0:
            return
        if g is None:
            g = torch.zeros(self.s._shapes[st - 1][0], dtype=self.s._shapes[st - 1][1], device=self.s.device)
        if self.s.P > 1:
            self.up_out.send(g)
        else:
            self.local[("grad", st - 1, mb)] = g

    def _free(self, st: int, mb: int):
        del self.held[(st, mb)]
        self.live_bytes -= self.act_bytes[(st, mb)]

    def _B(self, st: int, mb: int):
        x, out, _ = self.held[(st, mb)]
        torch.autograd.backward(out, self._grad_out(st, mb))
        self._send_input_grad(st, mb, x.grad if x.requires_grad else None)
        self._free(st, mb)

    def _I(self, st: int, mb: int):
        """Zero-bubble input gradient (and the gradients of the parameter owners' outputs, for W);
        no weight-gradient products. The graph is kept for W."""
        x, out, _ = self.held[(st, mb)]
        g_out = self._grad_out(st, mb)
        self.held[(st, mb)] = (x, out, g_out)
        x_in = x if st > 0 and x.requires_grad else None
        split = self.split.get((st, mb), [None, None])
        if split[0] is not None:
            gx, split[1] = backward_input(out, g_out, x_in, split[0])
        elif x_in is not None:
            (gx,) = torch.autograd.grad(out, [x_in], g_out, retain_graph=True, allow_unused=True)
        else:
            gx = None
        self._send_input_grad(st, mb, gx)

    def _W(self, st: int, mb: int):
        """Zero-bubble weight gradient: accumulate into the stage's parameters' .grad."""
        x, out, g_out = self.held[(st, mb)]
        rec, per_owner = self.split.pop((st, mb), [None, None])
        if rec is not None:
            backward_weight(rec, per_owner)
        else:  # fallback (see split_backward): walk the stage again from its output
            params = [p for p in self.s.stages[st].module.parameters() if p.requires_grad]
            if params:
                torch.autograd.backward(out, g_out, inputs=params)
        self._free(st, mb)


class ScheduleGPipe(_PipelineSchedule):
    """GPipe: every micro-batch's forward, then every backward (holds m micro-batches' activations)."""
    kind = "gpipe"


class Schedule1F1B(_PipelineSchedule):
    """1F1B: after P - r warm-up forwards, one forward per backward (holds at most P micro-batches)."""
    kind = "1f1b"


class ScheduleInterleaved1F1B(_PipelineSchedule):
    """Looping 1F1B: v stages per rank (stage s on rank s % P), Megatron's depth-first order; the
    bubble shrinks by about v. Takes the list of this rank's stages."""
    kind = "interleaved"


class ScheduleZeroBubble(_PipelineSchedule):
    """ZB-H1: each backward split into an input-gradient part I (sent upstream at once) and a
    weight-gradient part W deferred into the idle slots, at most P - r - 1 behind.

    I computes the activation gradients only; W the weight-gradient products only, from the
    outputs of the modules owning parameters (see split_backward.py, with its fallback for
    parameters tied inside a stage)."""
    kind = "zero_bubble"
