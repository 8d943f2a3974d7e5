"""CPU cost of the codecs per float32 element: the vectorised loops against the functors' scalar
reference (``reference=True``), encode and decode, process time (one core's worth on a shared
machine), median of ``--repeats``. docs/compression.md "Cost"; bench/RESULTS_compression.md.

    python bench/codec_rates.py [--elements 4194304] [--repeats 5]
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elements", type=int, default=1 << 22)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    n = args.elements
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
