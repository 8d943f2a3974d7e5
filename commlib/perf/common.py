"""What every part of the benchmark shares: sizes, busbw factors, buffers, test data and references.

Conventions (nccl-tests, docs/DESIGN.md "How we measure"):

* ``size`` (bytes) is the size of the largest buffer of the call: the buffer of all_reduce,
  broadcast and reduce, the output of all_gather and gather, the input of reduce_scatter and
  scatter, the (equal) input/output of all_to_all. ``count`` is that buffer's element count.
  For the per-rank collectives the per-rank block is ``count // P`` (at least one element), so the
  smallest sizes are rounded to a multiple of ``P * element size``.
* ``algbw = size / time``; ``busbw = algbw * factor`` with factor 2(P-1)/P for all_reduce,
  (P-1)/P for all_gather, reduce_scatter, all_to_all, gather and scatter, 1 for broadcast/reduce.
* The core's own ``bytes`` (what ``_C.choose_algorithm`` and the tuning table see) is the
  per-rank ``count`` of csrc/schedule/ir.h times the element size: :func:`core_bytes`.

Test data are small integers (exact under any summation order in every dtype), periodic in the
element index, so a reference for any rank is cheap to build on every rank.
"""
from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
import sys
import time

import numpy as np

import commlib._C as _C
from commlib.core.call_spec import COLLECTIVE as _COLLECTIVE
from commlib.device import dtypes

# Collectives the bench knows, in table order. The first five are the default sweep.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
               "reduce", "gather", "scatter")
DEFAULT_COLLECTIVES = COLLECTIVES[:5]
REDUCING = frozenset(("all_reduce", "reduce_scatter", "reduce"))
ROOTED = frozenset(("broadcast", "reduce", "gather", "scatter"))
# Collectives whose size is P per-rank blocks: a buffer of P * count elements in the core's shapes
# table (csrc/common/shapes.h; probed at P = 2, count = 1, root 0).
BLOCKED = frozenset(c for c in COLLECTIVES if 2 in _C.buffer_shapes(_COLLECTIVE[c], 1, 2)[:2])
# The mode peers are compared in (every backend has it): torch's all_reduce and broadcast work in
# place, the others have an out-of-place form everywhere.
COMPARE_MODE = {"all_reduce": "in", "all_gather": "out", "reduce_scatter": "out",
                "all_to_all": "out", "broadcast": "in", "reduce": "in", "gather": "out",
                "scatter": "out"}
MODES = ("out", "in")

DTYPES = dtypes.NAMES
OPS = ("sum", "prod", "min", "max", "avg", "premul_sum", "band", "bor", "bxor")
PREMUL_SCALE = 0.5



def elem_size(dtype: str) -> int:
    return dtypes.SIZE[dtype]


def bus_factor(collective: str, P: int) -> float:
    """nccl-tests bus-bandwidth factor (docs/DESIGN.md, "How we measure")."""
    if collective == "all_reduce":
        return 2.0 * (P - 1) / P
    if collective in ("broadcast", "reduce"):
        return 1.0
    return (P - 1) / P


def bandwidths(collective: str, size: int, P: int, seconds: float):
    """(algbw, busbw) in GB/s (1e9 bytes/s) for ``size`` bytes moved in ``seconds``."""
    if seconds <= 0:
        return 0.0, 0.0
    algbw = size / seconds / 1e9
    return algbw, algbw * bus_factor(collective, P)


# -- sizes ---------------------------------------------------------------------------------------
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text) -> int:
    """'8', '64K', '16M', '1G' (powers of 1024, like nccl-tests) -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"size: cannot parse {text!r} (examples: 8, 64K, 16M, 1G)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def size_list(begin: int, end: int, factor: float = 2.0, step: int = 0):
    """Sizes from ``begin`` to ``end``: geometric by ``factor`` (or arithmetic by ``step``).

    Unlike nccl-tests, ``end`` is always included (so ``-b 8 -e 16M -f 4`` ends at 16 MiB).
    """
    if begin <= 0 or end < begin:
        raise ValueError(f"sizes: need 0 < -b ({begin}) <= -e ({end})")
    if step <= 0 and factor <= 1:
        raise ValueError(f"-f: factor must be > 1 (got {factor})")
    out, s = [], begin
    while s <= end:
        out.append(int(s))
        s = s + step if step > 0 else int(s * factor) if int(s * factor) > s else s + 1
    if out[-1] != end:
        out.append(end)
    return out


def fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def fmt_approx(n: float) -> str:
    """16729 -> '16.3 KiB' (for sizes that are not powers of two, e.g. model crossovers)."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def fmt_short(n: float) -> str:
    """Axis labels: 8, 1K, 64K, 16M."""
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return f"{n:.0f}"


def geometry(collective: str, size: int, dtype: str, P: int):
    """(count, block, size) actually used for a requested ``size`` in bytes.

    ``count`` elements in the largest buffer, ``block`` elements per rank block (== count for the
    non-blocked collectives), ``size`` the byte size really measured (rounded down to whole
    elements and, for blocked collectives, whole per-rank blocks of at least one element).
    """
    es = elem_size(dtype)
    count = max(1, size // es)
    if collective in BLOCKED:
        block = max(1, count // P)
        count = block * P
    else:
        block = count
    return count, block, count * es


def core_bytes(collective: str, size: int, dtype: str, P: int) -> int:
    """The ``bytes`` the core's algorithm chooser sees for a bench ``size`` (ir.h per-rank count)."""
    _, block, _ = geometry(collective, size, dtype, P)
    return block * elem_size(dtype)


# -- buffers and test data -------------------------------------------------------------------------
_PERIOD = 45  # lcm of the residues used below


def _np_dtype(dtype: str):
    if dtype == "bfloat16":
        return None
    return np.dtype(dtype)


# Where the sweep's buffers live: "host", or a device of commlib/perf/device_buffers.py (--device).
_DEVICE = "host"


def use_device(device: str):
    global _DEVICE
    _DEVICE = device


def empty(count: int, dtype: str):
    """A buffer commlib, gloo and MPI all accept: NumPy, or a torch tensor for bfloat16 (with
    --device: a device buffer, commlib/bench/device.py)."""
    if _DEVICE != "host":
        from commlib.perf import device_buffers as device
        return device.empty(_DEVICE, count, dtype)
    if dtype == "bfloat16":
        import torch
        return torch.empty(count, dtype=torch.bfloat16)
    from commlib.perf.fresh_buffers import fresh_empty
    return fresh_empty(count, _np_dtype(dtype))  # large ones fresh mappings, whatever the process freed


def as_numpy_f64(buf) -> np.ndarray:
    """Values of a bench buffer as float64 (for comparisons)."""
    if not isinstance(buf, np.ndarray) and _DEVICE != "host":
        from commlib.perf import device_buffers as device
        return device.to_host(buf)
    if isinstance(buf, np.ndarray):
        return buf.astype(np.float64)
    return buf.float().numpy().astype(np.float64)


def _pattern(rank: int, op: str) -> np.ndarray:
    """One period of rank ``rank``'s values (float64, small integers)."""
    i = np.arange(_PERIOD * 2)
    if op == "prod":  # +-1 with an occasional 2: products stay small
        v = np.where((rank * 7 + i) % 5 == 0, -1.0, 1.0)
        v[(rank * 3 + i) % 9 == 0] = 2.0
        return v
    if op in ("band", "bor", "bxor"):
        return ((rank * 5 + i * 3) % 9 + (rank % 4) * 16).astype(np.float64)
    return (((rank * 3 + i * 5) % 9) - 4).astype(np.float64)


def values(rank: int, start: int, count: int, op: str, dtype: str) -> np.ndarray:
    """Rank ``rank``'s test values for global element indices [start, start+count) (float64)."""
    pat = _pattern(rank, op)
    if dtype in ("uint8",) and op not in ("prod", "band", "bor", "bxor"):
        pat = np.abs(pat)
    reps = (count + _PERIOD - 1) // _PERIOD + 1
    s = start % _PERIOD
    return np.tile(pat[:_PERIOD], reps)[s:s + count]


def fill(buf, vals: np.ndarray, offset: int = 0):
    """buf[offset:offset+len(vals)] = vals, for NumPy or torch buffers."""
    n = len(vals)
    if not isinstance(buf, np.ndarray) and _DEVICE != "host":
        from commlib.perf import device_buffers as device
        return device.fill(buf, vals, offset)
    if isinstance(buf, np.ndarray):
        buf[offset:offset + n] = vals.astype(buf.dtype)
    else:
        import torch
        buf[offset:offset + n] = torch.from_numpy(vals).to(buf.dtype)


def _reduce2(op: str, a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    if op in ("sum", "avg"):
        return a + b
    if op == "premul_sum":
        return a + b * PREMUL_SCALE
    if op == "prod":
        return a * b
    if op == "min":
        return np.minimum(a, b)
    if op == "max":
        return np.maximum(a, b)
    ia, ib = a.astype(np.int64), b.astype(np.int64)
    if op == "band":
        return (ia & ib).astype(np.float64)
    if op == "bor":
        return (ia | ib).astype(np.float64)
    if op == "bxor":
        return (ia ^ ib).astype(np.float64)
    raise ValueError(f"op: unknown {op!r}")


def reduced(P: int, start: int, count: int, op: str, dtype: str) -> np.ndarray:
    """Expected reduction over ranks 0..P-1 of the values at [start, start+count) (float64)."""
    acc = values(0, start, count, op, dtype)
    if op == "premul_sum":
        acc = acc * PREMUL_SCALE
    for r in range(1, P):
        acc = _reduce2(op, acc, values(r, start, count, op, dtype), dtype)
    if op == "avg":
        acc = acc / P
        if dtype not in dtypes.FLOATS:
            acc = np.trunc(acc)
    if dtype in dtypes.INTEGERS:  # wrap like the machine does
        acc = acc.astype(np.int64).astype(np.dtype(dtype)).astype(np.float64)
    return acc


def count_wrong(got, expected: np.ndarray, dtype: str, op: str) -> int:
    """Number of elements of ``got`` that differ from ``expected`` beyond rounding."""
    g = as_numpy_f64(got)
    if dtype in ("float16", "bfloat16"):
        tol = 1e-2
    elif dtype == "float32":
        tol = 1e-5
    elif dtype == "float64":
        tol = 1e-12
    else:
        tol = 0.0
    atol = 1.0 if (op == "avg" and tol == 0.0) else 0.0
    bad = ~np.isclose(g, expected, rtol=tol, atol=atol + tol)
    return int(np.count_nonzero(bad))


# -- machine ---------------------------------------------------------------------------------------
def _cpu_model() -> str:
    """The CPU model, as the tuning file's machine sections name it (commlib.core.tuning.this_machine)."""
    from commlib.core.tuning import this_machine
    return this_machine()["cpu"]


def _mem_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return None


def _version(dist: str):
    """Installed version of a distribution, without importing it (importing torch takes seconds)."""
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:
        return None


def _git_commit():
    try:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:
        return None


def machine_info() -> dict:
    """Machine, OS and library versions the numbers come from."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    info = {
        "hostname": socket.gethostname(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "memory_gib": _mem_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": _version("torch"),
        "mpi4py": _version("mpi4py"),
        "commlib": _version("commlib") or getattr(sys.modules.get("commlib"), "__version__", None),
        "commlib_commit": _git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    return info


def log(msg: str):
    print(msg, file=sys.stderr, flush=True)
