"""PipelineStage: one stage of a pipeline (a module, its index, the stage count, the communicator)."""
from __future__ import annotations

import torch

__all__ = ["PipelineStage"]


class PipelineStage:
    """A part of a model run as stage ``stage_index`` of ``num_stages`` over the pipeline
    communicator ``comm`` (one rank per pipeline position, e.g. ``Mesh.pp``).

    Stage ``s`` must live on rank ``s % comm.size``: with ``num_stages == comm.size`` each rank holds
    one stage; with ``num_stages = v * comm.size`` each holds ``v`` (a looping pipeline, for
    :class:`ScheduleInterleaved1F1B` and friends, which take the list of a rank's stages).

    The module takes one tensor and returns one tensor (the first stage's input is the
    micro-batch, the last stage's output goes to the schedule's ``loss_fn``). The shapes passed
    between stages are agreed at the first step of a schedule, by one small message per stage
    boundary, and then fixed: every later micro-batch must produce the same shape and dtype.

    The stage runs on its module's device: the CPU (host messages), or one CUDA device, whose
    messages move on communication streams of the stage while it computes on torch's current
    stream (device_io.py). ``device`` names it for a module without parameters or buffers (the
    default is then the CPU); every rank of the pipeline must use the same kind of device.
    """

    def __init__(self, module: torch.nn.Module, stage_index: int, num_stages: int, comm, device=None):
        if not isinstance(num_stages, int) or num_stages < 1:
            raise ValueError(f"num_stages: must be a positive int, got {num_stages!r}")
        if not isinstance(stage_index, int) or not 0 <= stage_index < num_stages:
            raise ValueError(f"stage_index: must be in [0, {num_stages}), got {stage_index!r}")
        if num_stages % comm.size:
            raise ValueError(f"num_stages: {num_stages} stages do not place evenly on the {comm.size} "
                             f"ranks of comm (stage s lives on rank s % {comm.size})")
        if stage_index % comm.size != comm.rank:
            raise ValueError(f"stage_index: stage {stage_index} lives on rank {stage_index % comm.size} of "
                             f"comm (stage s on rank s % {comm.size}), not on this rank {comm.rank}")
        if device is not None:
            device = torch.device(device)
            if device.type not in ("cpu", "cuda"):
                raise ValueError(f"device: pipeline stages run on the CPU or a CUDA device, not {device}")
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if t.device.type not in ("cpu", "cuda"):
                raise ValueError(f"module: {name!r} is on {t.device}; pipeline stages run on the CPU or "
                                 "one CUDA device")
            if device is None:
                device = t.device
            elif not same_device(t.device, device):
                raise ValueError(f"module: {name!r} is on {t.device} but the stage is on {device}; "
                                 "put the stage's module on one device")
        self.device = device if device is not None else torch.device("cpu")
        self.module = module
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.comm = comm

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def __repr__(self):
        return (f"PipelineStage({self.stage_index}/{self.num_stages}, rank {self.comm.rank}/{self.comm.size}, "
                f"{self.device})")


def same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` (the current device) and ``cuda:i`` are the same device when i is the current one;
    the index is compared only when both name one."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)
