"""Pipeline parallelism on commlib point-to-point: stages, schedules, timelines.

See docs/pipeline.md. ``actions`` builds the per-rank action orders (pure data), ``lanes`` moves
activations and gradients, ``schedules`` runs the orders, ``timeline`` plots and measures them.
"""
from commlib.parallel.pipeline.schedules import (Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                                 ScheduleZeroBubble)
from commlib.parallel.pipeline.stage import PipelineStage

__all__ = ["PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleZeroBubble"]
