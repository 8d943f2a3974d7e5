"""A training run whose every sum is exact in float64, so survivors can be compared bit for bit with
a one-process replay whatever order a collective added the ranks' gradients in.

Linear least squares on small integer data, plain SGD with a power-of-two learning rate on the
*sum* of the ranks' gradients: parameters stay multiples of a power of two with few significant
bits for the first few steps (checked for 8 steps over 8 ranks in every summation order), so the
all_reduce of the gradients is exact and the replay's sum, in rank order, is the same number.
"""
from __future__ import annotations

import numpy as np

DIM = 4
LR = 2.0 ** -6
STEPS = 6  # stay well inside the exact range (see the module docstring)


def batch(step: int, rank: int, n: int = 4):
    """Rank ``rank``'s batch at ``step``: integer inputs and targets (float64)."""
    rng = np.random.default_rng(1000 * step + rank)
    x = rng.integers(-2, 3, size=(n, DIM)).astype(np.float64)
    y = rng.integers(-3, 4, size=n).astype(np.float64)
    return x, y


def gradient(w: np.ndarray, step: int, rank: int) -> np.ndarray:
    """Gradient of 0.5 * |x w - y|^2 on rank ``rank``'s batch at ``step``."""
    x, y = batch(step, rank)
    return x.T @ (x @ w - y)


def replay(members_by_step, divisors=None) -> np.ndarray:
    """Parameters after one process replays the steps: step i sums the gradients of the (original)
    ranks in ``members_by_step[i]`` and divides the sum by ``divisors[i]`` (default 1)."""
    w = np.zeros(DIM)
    for step, members in enumerate(members_by_step):
        total = np.zeros(DIM)
        for r in sorted(members):
            total = total + gradient(w, step, r)
        if divisors is not None and divisors[step] != 1:
            total = total / divisors[step]
        w = w - LR * total
    return w
