"""Rank-side functions: TinyGPT trained data-parallel with compressed gradient averaging, with and
without error feedback, against the uncompressed run (docs/compression.md, "Which combinations
converge"). Imported as ``parallel.ef_cases``."""
from __future__ import annotations

import torch

from commlib.models import gpt
from commlib.parallel import DataParallel

STEPS, ROWS_PER_RANK, SEQ, LR = 24, 2, 16, 0.5


def train_tinygpt(comm, compress=None, error_feedback=False):
    """SGD on TinyGPT, each rank on its ROWS_PER_RANK rows of the batch; returns (global losses
    per step, bucket residual norms or None)."""
    torch.set_num_threads(1)
    cfg = gpt.GPTConfig()
    model = gpt.TinyGPT(cfg)
    dp = DataParallel(model, comm, bucket_cap_mb=0.05, compress=compress, error_feedback=error_feedback)
    opt = torch.optim.SGD(dp.parameters(), lr=LR)
    losses, _ = gpt.train_data_parallel(dp, opt, comm, gpt.batches(cfg, STEPS, ROWS_PER_RANK * comm.size, SEQ),
                                        ROWS_PER_RANK)
    residuals = [float(e.norm()) for e in dp._residuals.values()] if error_feedback else None
    return losses, residuals


def refusals(comm):
    """DataParallel's compress arguments refused before anything is sent, naming the argument."""
    import pytest
    for kwargs, exc, name in [({"error_feedback": True}, ValueError, "error_feedback"),
                              ({"compress": "int3"}, ValueError, "compress"),
                              ({"compress": 8}, TypeError, "compress"),
                              ({"compress": "int8", "error_feedback": 1}, TypeError, "error_feedback")]:
        with pytest.raises(exc, match=name):
            DataParallel(torch.nn.Linear(2, 2), comm, **kwargs)
    with pytest.raises(ValueError, match="error_feedback"):  # residuals are float32
        DataParallel(torch.nn.Linear(2, 2).double(), comm, compress="int8", error_feedback=True)
    return True
