"""Micro-benchmark: the CPU reduction kernels against NumPy and against memcpy.

    python bench/kernels_bench.py                    # every vector path, float32 + 16-bit floats
    python bench/kernels_bench.py --sizes 64M --dtypes float32,bfloat16 --iters 30

Bandwidth counts the bytes a kernel must move: a reduce reads dst and src and writes dst (3 x the
buffer size), a copy reads and writes once (2 x). Medians of --iters runs; on a shared machine
only the ratios in one run mean anything (see docs/DESIGN.md, "How we measure").
"""
import argparse
import time

import numpy as np

import commlib._C as _C
from commlib.core import call_spec

NUMPY_DTYPE = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "bfloat16": np.uint16,
               "int8": np.int8, "uint8": np.uint8, "int32": np.int32, "int64": np.int64}


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def median_time(fn, iters):
    fn()  # warm-up (page faults, caches)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def data(dtype, nbytes, rng):
    n = nbytes // np.dtype(NUMPY_DTYPE[dtype]).itemsize
    if dtype == "bfloat16":
        return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if dtype in ("int8", "uint8", "int32", "int64"):
        return rng.integers(0, 100, size=n).astype(NUMPY_DTYPE[dtype])
    return rng.standard_normal(n).astype(NUMPY_DTYPE[dtype])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256K,4M,64M", help="buffer sizes in bytes (K/M/G suffixes)")
    ap.add_argument("--dtypes", default="float32,float16,bfloat16")
    ap.add_argument("--op", default="sum")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--paths", default="all", help="comma list of vector paths, or 'all'")
    args = ap.parse_args()

    paths = _C._cpu_paths() if args.paths == "all" else args.paths.split(",")
    default_path = _C.cpu_features()
    rng = np.random.default_rng(0)
    print(f"default CPU reduction path: {default_path}; supported: {', '.join(_C._cpu_paths())}")
    print(f"{'size':>8} {'dtype':>9} {'impl':>16} {'time(us)':>10} {'GB/s':>8} {'vs numpy':>9} {'vs memcpy':>9}")
    try:
        for size_s in args.sizes.split(","):
            nbytes = parse_size(size_s)
            for dtype in args.dtypes.split(","):
                a = data(dtype, nbytes, rng)
                b = data(dtype, nbytes, rng)
                c = np.empty_like(a)
                t_copy = median_time(lambda: np.copyto(c, a), args.iters)
                bw_copy = 2 * a.nbytes / t_copy
                rows = [("memcpy(np.copyto)", t_copy, bw_copy)]
                t_np = None
                if dtype != "bfloat16" and args.op == "sum":  # NumPy has no bfloat16
                    t_np = median_time(lambda: np.add(a, b, out=a), args.iters)
                    rows.append(("numpy np.add", t_np, 3 * a.nbytes / t_np))
                for path in paths:
                    _C._set_cpu_path(path)
                    dt, op = call_spec.dtype(dtype), call_spec.op(args.op)  # converted once, outside the timing
                    t = median_time(lambda: _C.reduce_local(a, b, dt, op), args.iters)
                    rows.append((f"commlib {path}", t, 3 * a.nbytes / t))
                _C._set_cpu_path(default_path)
                for name, t, bw in rows:
                    vs_np = f"{t_np / t:8.2f}x" if t_np and name.startswith("commlib") else ""
                    vs_cp = f"{bw / bw_copy:8.2f}x" if name.startswith("commlib") else ""
                    print(f"{size_s:>8} {dtype:>9} {name:>16} {t * 1e6:10.1f} {bw / 1e9:8.2f} {vs_np:>9} {vs_cp:>9}")
    finally:
        _C._set_cpu_path(default_path)


if __name__ == "__main__":
    main()
