"""The physical reference: one thread copying ``size`` bytes with NumPy (``np.copyto``).

Bandwidth is bytes copied per second (each byte is read once and written once), the same unit as
algbw. A collective's busbw can be read against it: a shared-memory all_reduce must at least copy
and reduce each byte, so busbw near this figure means the memory system, not the library, is the
limit.
"""
from __future__ import annotations

import time

import numpy as np


def measure(sizes, iters=20, warmup=3):
    """[{'bytes', 'time_us': {median, min, max}, 'GBps'}] for each size."""
    out = []
    for size in sizes:
        src = np.ones(max(1, size), np.uint8)
        dst = np.empty_like(src)
        n = max(iters, 5)
        for _ in range(warmup):
            np.copyto(dst, src)
        ts = np.empty(n)
        pc = time.perf_counter
        for k in range(n):
            t0 = pc()
            np.copyto(dst, src)
            ts[k] = pc() - t0
        med = float(np.median(ts))
        out.append({"bytes": int(size), "time_us": {"median": med * 1e6, "min": float(ts.min()) * 1e6,
                                                    "max": float(ts.max()) * 1e6},
                    "GBps": size / med / 1e9 if med > 0 else 0.0})
    return out


def largest(records) -> float:
    """Bandwidth at the largest size (GB/s): the memcpy figure quoted in reports (the small sizes
    run from cache and say little about memory)."""
    return max(records, key=lambda r: r["bytes"])["GBps"] if records else 0.0
