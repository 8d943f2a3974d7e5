"""Parallelisms built on commlib communicators (groups are always passed explicitly).

Names are imported lazily so that importing one parallelism does not import every other.
"""
import importlib

_EXPORTS = {
    # data parallelism (data_parallel.py, zero.py, fully_sharded.py, parameter_server.py)
    "DataParallel": "data_parallel",
    "ZeroOptimizer": "zero",
    "FullyShardedModule": "fully_sharded",
    "ParameterServer": "parameter_server",
    "broadcast_optimizer_state": "_state_transfer",  # what DataParallel.grow sends a joiner
    # tensor parallelism (tensor.py)
    "ColumnParallelLinear": "tensor",
    "RowParallelLinear": "tensor",
    "VocabParallelEmbedding": "tensor",
    "vocab_parallel_cross_entropy": "tensor",
    "ParallelAttention": "tensor",
    # sequence parallelism (sequence.py)
    "ring_attention": "sequence",
    "ulysses_attention": "sequence",
    "hybrid_attention": "sequence",
    "zigzag_split": "sequence",
    "zigzag_merge": "sequence",
    # pipeline parallelism (pipeline/) and the device mesh (mesh.py)
    "PipelineStage": "pipeline",
    "ScheduleGPipe": "pipeline",
    "Schedule1F1B": "pipeline",
    "ScheduleInterleaved1F1B": "pipeline",
    "ScheduleZeroBubble": "pipeline",
    "Mesh": "mesh",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'commlib.parallel' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
