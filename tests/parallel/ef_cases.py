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


def feedback_per_gradient(comm):
    """DataParallel's error feedback runs on each parameter's slice as its gradient goes into the
    bucket (one pass with the copy), and on an unused parameter's zeros at the end of backward: on
    one rank (the all_reduce then returns its input) every gradient equals Q(g + e) and every
    residual slice g + e - Q(g + e), bit for bit the codec's round trip on that parameter alone,
    over steps where a parameter is used only every other step. Sizes are odd, so slices start
    inside the bucket's blocks."""
    import numpy as np

    from commlib.codecs import Codec
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(5, 7), torch.nn.Linear(7, 3)
            self.sometimes = torch.nn.Parameter(torch.randn(11))

        def forward(self, x, use):
            y = self.b(torch.tanh(self.a(x))).sum()
            return y + self.sometimes.square().sum() if use else y

    codec = Codec("int4", block_size=4)
    dp = DataParallel(Net(), comm, bucket_cap_mb=100 / 2**20, first_bucket_cap_mb=60 / 2**20, compress=codec,
                      error_feedback=True)
    assert len(dp.bucket_sizes) > 1, dp.bucket_sizes
    ref = Net()
    ref.load_state_dict(dp.module.state_dict())
    names = [n for n, _ in dp.module.named_parameters()]
    residual = {n: np.zeros(p.numel(), np.float32) for n, p in dp.module.named_parameters()}
    for step in range(6):
        x, use = torch.randn(4, 5), step % 2 == 0
        for m in (dp, ref):
            m.zero_grad(set_to_none=True)
        dp(x, use).backward()
        ref(x, use).backward()
        slots = {n: dp._where[id(p)] for n, p in dp.module.named_parameters()}
        for n, p in zip(names, ref.parameters()):
            g = np.zeros(p.numel(), np.float32) if p.grad is None else p.grad.detach().numpy().ravel()
            s = g + residual[n]
            want = codec.round_trip(s)
            residual[n] = s - want
            got = dict(dp.module.named_parameters())[n].grad.detach().numpy().ravel()
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (step, n, got, want)
            b, i = slots[n]
            o = b.layout.offsets[i]
            r = dp._residuals[b.index][o:o + p.numel()].numpy()
            assert np.array_equal(r.view(np.uint32), residual[n].view(np.uint32)), (step, n)
    return True
