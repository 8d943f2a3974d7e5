"""CPU cost of the codecs per float32 element: the vectorised loops against the functors' scalar
reference (``reference=True``), encode and decode, process time (one core's worth on a shared
machine), median of ``--repeats``. docs/compression.md "Cost"; bench/RESULTS_compression.md.
``--feedback``: error feedback's step instead (error_feedback_round's fused pass against the
whole-buffer composition on torch tensors it ran before: add, round trip, subtract, copy).

    python bench/codec_rates.py [--elements 4194304] [--repeats 5] [--feedback]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commlib.codecs import NAMES, Codec  # noqa: E402


def rate(fn, n: int, repeats: int) -> float:
    """Median ns per element of fn() over ``repeats`` runs (process time)."""
    times = []
    for _ in range(repeats):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return float(np.median(times)) / n * 1e9


def composed_feedback(codec, grad, residual, src=None):
    """error_feedback_round as it was before the fused pass (torch tensors, whole-buffer passes;
    ``src``: the gradient, copied into ``grad`` first)."""
    if src is not None:
        grad.copy_(src)
    if residual is not None:
        grad.add_(residual)
    q = grad.new_tensor(codec.round_trip(grad.detach().numpy()))
    new_residual = grad - q
    grad.copy_(q)
    return new_residual


def feedback_rates(n: int, repeats: int) -> None:
    """ns per element of one error-feedback step, fused against composed (process time)."""
    import torch

    from commlib.core.codecs import error_feedback_round
    torch.set_num_threads(1)
    g0 = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 1e-3
    print("| codec | rounding | error feedback, fused (ns) | composed |")
    print("| --- | --- | --- | --- |")
    for name, rounding in (("int8", "nearest"), ("int4", "nearest"), ("int8", "stochastic"), ("fp8_e4m3", "nearest"),
                           ("bf16", "nearest")):
        c = Codec(name, 32, rounding, seed=1)
        residual, grad = torch.zeros(n), g0.clone()
        fused = rate(lambda: error_feedback_round(c, grad, residual), n, repeats)
        composed = rate(lambda: composed_feedback(c, grad, residual), n, repeats)
        print(f"| {name} | {rounding} | {fused:.2f} | {composed:.2f} |", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elements", type=int, default=1 << 22)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--feedback", action="store_true", help="error feedback's step, fused against composed")
    args = p.parse_args(argv)
    n = args.elements
    if args.feedback:
        print(f"# load average at start: {os.getloadavg()}")
        feedback_rates(n, args.repeats)
        print(f"# load average at end: {os.getloadavg()} (ns per element, process time)")
        return 0
    x = (np.random.default_rng(0).standard_normal(n) * 1e-3).astype(np.float32)
    print(f"# load average at start: {os.getloadavg()}")
    print("| codec | rounding | encode, loops | encode, functors | decode, loops | decode, functors |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in NAMES:
        for rounding in ("nearest", "stochastic"):
            c = Codec(name, 32, rounding, seed=1)
            data = c.encode(x)
            cells = []
            for ref in (False, True):
                cells.append(rate(lambda: c.encode(x, reference=ref), n, args.repeats))
            for ref in (False, True):
                cells.append(rate(lambda: c.decode(data, n, reference=ref), n, args.repeats))
            print(f"| {name} | {rounding} | " + " | ".join(f"{v:.2f}" for v in cells) + " |", flush=True)
    print(f"# load average at end: {os.getloadavg()} (ns per element, process time)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
