"""The device bench's paths (``commlib bench --device ... --paths auto,kernel,copy``).

The stream engine runs a collective on device buffers either as one kernel launch (the kernel path)
or as copy-engine copies ordered by stream memory operations (the copy path); ``auto`` takes the
kernel at every size, or up to the tuning file's crossover (docs/gpu.md "The kernel path"). The path is chosen when an engine is
created (COMMLIB_DEVICE_PATH), so the bench gives each path its own sub-communicator, set up with
the setting in the environment, and names its algorithms ``<algorithm>@<path>``. Every record says
which path its calls ran on (``auto`` decides per size), and the report puts the paths side by side
with the device-to-device copy bandwidth measured in the same job as the reference.

On the emulated device these numbers say nothing about a GPU: its kernels are host threads and its
copies memcpys on a shared CPU.
"""
from __future__ import annotations

import time

import numpy as np

from commlib import settings

PATHS = ("auto", "kernel", "copy")


def parse_paths(text: str) -> list:
    paths = [p for p in text.split(",") if p]
    bad = [p for p in paths if p not in PATHS]
    if bad or not paths:
        raise SystemExit(f"commlib bench: --paths: expected a comma list of {', '.join(PATHS)}, got {text!r}")
    return paths


def device_name(device: str) -> str:
    if device == "emulated":
        from commlib.device import emulated
        return f"emulated:{emulated.current_device()}"
    import torch
    return f"cuda:{torch.cuda.current_device()}"


def path_communicators(comm, device: str, paths) -> dict:
    """{path: a sub-communicator whose engine was created with COMMLIB_DEVICE_PATH=path}."""
    out = {}
    for p in paths:
        with settings.overridden({"COMMLIB_DEVICE_PATH": p}):
            out[p] = comm.split(0, device=device_name(device))  # the engine is set up here, with p
    return out


def split_algorithm(name: str):
    """"ring@kernel" -> ("ring", "kernel"); "ring" -> ("ring", None)."""
    algo, _, path = name.partition("@")
    return algo, (path or None)


def copy_bandwidth(device: str, nbytes: int, reps: int = 5) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes copied / time, median of `reps`), the
    reference the paths' bandwidths are read against."""
    from commlib.perf.device_buffers import empty
    n = max(nbytes, 1 << 20) // 4
    src, dst = empty(device, n, "float32"), empty(device, n, "float32")
    if device == "emulated":
        from commlib.device import emulated
        sync, copy = emulated.current_stream().synchronize, (lambda: dst.copy_(src))
    else:
        import torch
        sync, copy = torch.cuda.current_stream().synchronize, (lambda: dst.copy_(src))
    copy()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        copy()
        sync()
        times.append(time.perf_counter() - t0)
    return n * 4 / float(np.median(times)) / 1e9


def path_rows(records):
    """Per (collective, size, mode, algorithm): each path's median µs and busbw, the path auto's
    calls ran on, and copy-path time / kernel-path time (> 1: the kernel path is faster)."""
    rows = {}
    for r in records:
        if r["backend"] != "commlib" or "@" not in r["algorithm"]:
            continue
        algo, path = split_algorithm(r["algorithm"])
        key = (r["collective"], r["bytes"], r["mode"], algo)
        row = rows.setdefault(key, {"collective": key[0], "bytes": key[1], "mode": key[2], "algorithm": algo})
        row[path] = {"us": r["time_us"]["median"], "busbw": r["busbw_GBps"], "ran": r.get("path", "?")}
    out = []
    for key in sorted(rows):
        row = rows[key]
        k, c = row.get("kernel"), row.get("copy")
        row["copy_over_kernel"] = c["us"] / k["us"] if k and c and k["us"] else None
        out.append(row)
    return out


def markdown(data) -> str:
    """The paths side by side (empty when the run compared none)."""
    from commlib.perf.common import fmt_bytes
    rows = path_rows(data.get("results", []))
    if not rows:
        return ""
    info = data.get("backends", {}).get("commlib", {})
    copy_bw = info.get("device_copy_GBps")
    device = data.get("device", info.get("device", "?"))
    paths = [p for p in PATHS if any(p in r for r in rows)]
    lines = [f"Paths compared on the {device} device ({data.get('world_size')} ranks): median µs per call "
             "(enqueue + stream synchronize), busbw GB/s, and for `auto` the path its calls ran on."]
    if copy_bw:
        lines[0] += (f" Device-to-device copy in the same job: {copy_bw:.1f} GB/s "
                     f"({fmt_bytes(info.get('device_copy_bytes', 0))} copied); `/copy` = busbw / that.")
    if device == "emulated":
        lines.append("")
        lines.append("**Emulated device: these numbers say nothing about a GPU** (its kernels are host threads, "
                     "its copies memcpys on a shared CPU).")
    head = ["collective", "size", "mode", "algorithm"]
    for p in paths:
        head += [f"{p} µs", f"{p} GB/s"] + (["/copy"] if copy_bw else []) + (["auto ran"] if p == "auto" else [])
    head.append("copy/kernel time")
    lines += ["", "| " + " | ".join(head) + " |", "| " + " | ".join(["---"] * len(head)) + " |"]
    for r in rows:
        cells = [r["collective"], fmt_bytes(r["bytes"]), r["mode"], r["algorithm"]]
        for p in paths:
            v = r.get(p)
            cells += [f"{v['us']:.1f}" if v else "", f"{v['busbw']:.3g}" if v else ""]
            if copy_bw:
                cells.append(f"{v['busbw'] / copy_bw:.3g}" if v else "")
            if p == "auto":
                cells.append(v["ran"] if v else "")
        cells.append(f"{r['copy_over_kernel']:.2f}" if r["copy_over_kernel"] else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
