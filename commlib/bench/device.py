"""``commlib bench --device cuda|emulated``: the same sweep on device buffers.

Buffers are ``commlib.emulated`` arrays (``--device emulated``) or torch CUDA tensors (``--device
cuda``); every call goes through the stream engine (csrc/stream/stream_engine.h) over the links
``COMMLIB_DEVICE_LINK`` chooses. A timed call is the enqueue plus a synchronisation of the current
stream, so its time is the call's completion as the host sees it (nccl-tests times a loop of
calls between two events instead, which leaves the host's wake-up out). Bus bandwidth is
nccl-tests' (commlib/perf/common.py: bandwidths).

``--peers nccl``: NCCL's own collectives through the same libnccl (``algorithm="nccl"``: the call
goes to ncclAllReduce etc.; all_to_all, gather and scatter are grouped ncclSend/ncclRecv, as torch
does), in the same job. On the emulated device that peer is the *emulated* NCCL (a test double of
NCCL's API semantics, csrc/device/emulated/nccl_emulated.h): its backend is named ``nccl-emulated`` and its
numbers say nothing about NCCL.
"""
from __future__ import annotations

import functools

import numpy as np

from commlib.perf.device_buffers import empty, fill, is_device_buffer, to_host  # noqa: F401 (re-exported)
from commlib.bench.backends import CommlibBackend

DEVICES = ("host", "emulated", "cuda")


def check_config(device: str, dtype: str, peers) -> None:
    """SystemExit for what the device sweep cannot do."""
    if device == "host":
        if "nccl" in peers:
            raise SystemExit("commlib bench: --peers nccl needs --device cuda or emulated")
        return
    if device == "emulated" and dtype == "bfloat16":
        raise SystemExit("commlib bench: --device emulated: bfloat16 is not supported by the bench (use -d float16)")
    other = [p for p in peers if p != "nccl"]
    if other:
        raise SystemExit(f"commlib bench: --device {device}: peers {', '.join(other)} run on host memory; "
                         "only nccl compares on the device")


def synchronizer(device: str):
    if device == "emulated":
        from commlib.device import emulated
        return emulated.current_stream().synchronize
    import torch
    return torch.cuda.current_stream().synchronize


def _timed(call, sync):
    call()
    sync()


class _TimedOnPath:
    """A timed call that notes, at its first call, the path its communicator's engine took."""

    def __init__(self, call, sync, comm, algorithm, ran):
        self.call, self.sync, self.comm, self.algorithm, self.ran = call, sync, comm, algorithm, ran
        self.first = True

    def __call__(self):
        self.call()
        self.sync()
        if self.first:
            self.first = False
            self.ran[self.algorithm] = self.comm._device_route.last_path()


class DeviceBackend(CommlibBackend):
    """commlib's collectives on device buffers (``nccl_peer``: NCCL's own, ``algorithm="nccl"``)."""

    def __init__(self, comm, device: str, nccl_peer: bool = False, paths=None):
        super().__init__(comm)
        from commlib import settings
        self.device = device
        self.nccl_peer = nccl_peer
        self._path = None  # COMMLIB_DEVICE_PATH of the communicator's engine (None: the NCCL peer)
        if device == "cuda":  # one GPU per local rank where there are several
            import os

            import torch
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % max(torch.cuda.device_count(), 1))
        elif device == "emulated" and nccl_peer:  # the emulated NCCL, like NCCL, needs a device per rank
            from commlib.device import emulated
            emulated.set_device(comm.rank)
        self._sync = synchronizer(device)
        link = settings.get_choice("COMMLIB_DEVICE_LINK", settings.DEVICE_LINKS)
        if nccl_peer:
            self.name = "nccl-emulated" if device == "emulated" else "nccl"
            self.transport = ("emulated NCCL (test double, not NCCL)" if device == "emulated"
                              else "NCCL")
        else:
            path = settings.get_choice("COMMLIB_DEVICE_PATH", settings.DEVICE_PATHS)
            self._path = path
            # Which path runs (docs/gpu.md "The kernel path"): auto decides per size, the same way
            # on every rank, so the size column says which one each row measured.
            shown = "auto (kernel at every size unless the tuning file's crossover says copy)" if path == "auto" else path
            self.transport = f"{device} device, link {link}, path {shown}"
        # --paths: one sub-communicator per path, algorithms named "<algorithm>@<path>"
        # (commlib/bench/device_paths.py); `_ran`: the path each algorithm's calls last ran on.
        self._path_comms = {}
        self._ran = {}
        if paths and list(paths) != ["auto"] and not nccl_peer:  # auto alone: the plain names
            from commlib.bench import device_paths
            self._path_comms = device_paths.path_communicators(comm, device, paths)
            self.transport = (f"{device} device, link {link}, "
                              f"paths {', '.join(paths)} (auto: kernel unless the tuning file's crossover says copy)")

    def algorithms(self, collective):
        """The host's algorithms and auto on every path, and the one-sided ones (docs/gpu.md
        "One-sided plans on the kernel path") where the kernel path runs them: ``<name>@kernel``
        with --paths, the plain name when the communicator's COMMLIB_DEVICE_PATH is ``kernel``
        (the copy path, and auto above its crossover, refuse them)."""
        if self.nccl_peer:
            return ["nccl"]
        base = super().algorithms(collective)
        one_sided = [a for a in self._commlib.algorithms(collective, one_sided=True) if a not in base]
        if self._path_comms:
            return ([f"{a}@{p}" for p in self._path_comms for a in base] +
                    [f"{a}@kernel" for a in one_sided if "kernel" in self._path_comms])
        return base + (one_sided if self._path == "kernel" else [])

    def refusable(self, collective, algorithm):
        """Whether a call of ``algorithm`` may be refused at some sizes (sweep.py leaves it out of
        them): a one-sided algorithm whose unregistered buffers do not fit the kernel path's
        staging area (a ValueError before anything is sent, alike on every rank)."""
        from commlib.bench.device_paths import split_algorithm
        name = split_algorithm(algorithm)[0]
        return name not in self._commlib.algorithms(collective) and \
            name in self._commlib.algorithms(collective, one_sided=True)

    def supports(self, collective, mode, op, dtype):
        if self.nccl_peer and op in ("band", "bor", "bxor"):
            return False
        return super().supports(collective, mode, op, dtype)

    def make(self, collective, algorithm, mode, bufs, op, root):
        from commlib.bench.device_paths import split_algorithm
        algo, path = split_algorithm(algorithm)
        if path is None:
            call = super().make(collective, "nccl" if self.nccl_peer else algo, mode, bufs, op, root)
            return _TimedOnPath(call, self._sync, self.comm, algorithm, self._ran)
        own, self.comm = self.comm, self._path_comms[path]
        try:
            call = super().make(collective, algo, mode, bufs, op, root)
        finally:
            self.comm, path_comm = own, self.comm
        return _TimedOnPath(call, self._sync, path_comm, algorithm, self._ran)

    def resolve(self, collective, algorithm, size, dtype):
        from commlib.bench.device_paths import split_algorithm
        return "nccl" if self.nccl_peer else super().resolve(collective, split_algorithm(algorithm)[0], size, dtype)

    def ran_path(self, algorithm):
        """The path ("kernel" / "copy") the calls of `algorithm` ran on, as of its latest size."""
        return self._ran.get(algorithm)

    def extra_info(self, cfg):
        """Rank 0, after the sweep: the device-to-device copy bandwidth, the paths' reference."""
        if self.nccl_peer or self.rank != 0:
            return {"device": self.device}
        from commlib.bench.device_paths import copy_bandwidth
        nbytes = min(max(cfg.get("sizes") or [1 << 20]), 256 << 20)
        return {"device": self.device, "device_copy_GBps": copy_bandwidth(self.device, nbytes),
                "device_copy_bytes": max(nbytes, 1 << 20)}

    def close(self):
        for c in self._path_comms.values():
            c.close()
        self._path_comms = {}


# -- summary: our best against NCCL (scripts/gpu_check.sh writes it into bench/RESULTS_gpu.md) -----
def _best(records, coll, size, mode):
    ours = [r for r in records if r["backend"] == "commlib" and r["collective"] == coll and r["bytes"] == size
            and r["mode"] == mode and r["algorithm"] != "auto"]
    return min(ours, key=lambda r: r["time_us"]["median"]) if ours else None


def peer_rows(data):
    """Per (collective, size, mode) with an NCCL record: our best algorithm and NCCL's, median
    time and busbw, and the ratios (ours / NCCL for busbw, NCCL / ours for time: > 1 is ours
    ahead)."""
    recs = data["results"]
    rows = []
    for n in sorted((r for r in recs if r["backend"].startswith("nccl")),
                    key=lambda r: (r["collective"], r["bytes"], r["mode"])):
        best = _best(recs, n["collective"], n["bytes"], n["mode"])
        if best is None:
            continue
        t_ours, t_nccl = best["time_us"]["median"], n["time_us"]["median"]
        rows.append({"collective": n["collective"], "bytes": n["bytes"], "mode": n["mode"], "peer": n["backend"],
                     "best": best["algorithm"], "ours_us": t_ours, "nccl_us": t_nccl,
                     "ours_busbw": best["busbw_GBps"], "nccl_busbw": n["busbw_GBps"],
                     "time_ratio": t_nccl / t_ours if t_ours else float("nan"),
                     "busbw_ratio": best["busbw_GBps"] / n["busbw_GBps"] if n["busbw_GBps"] else float("nan")})
    return rows


def targets(rows, world_size):
    """Issue #14's two all_reduce targets, judged on ``rows`` (peer_rows)."""
    big = [r for r in rows if r["collective"] == "all_reduce" and r["bytes"] >= 256 << 20]
    small = [r for r in rows if r["collective"] == "all_reduce" and r["bytes"] <= 64 << 10]

    def verdict(rs, ok, what):
        if rs and all(r["peer"] == "nccl-emulated" for r in rs):
            return "not measured: the peer is the emulated NCCL (a test double), not NCCL"
        if not rs:
            return "not measured (no all_reduce row against NCCL at these sizes)"
        bad = [r for r in rs if not ok(r)]
        worst = min(r["busbw_ratio" if what == "busbw" else "time_ratio"] for r in rs)
        return (("met" if not bad else f"missed at {len(bad)} of {len(rs)} sizes") +
                f" ({world_size} ranks; worst {what} ratio {worst:.2f})")
    return [("our best all_reduce busbw >= NCCL's at >= 256 MiB", verdict(big, lambda r: r["busbw_ratio"] >= 1, "busbw")),
            ("our best all_reduce time <= NCCL's at <= 64 KiB", verdict(small, lambda r: r["time_ratio"] >= 1, "time"))]


def markdown(data) -> str:
    """The comparison as markdown (one table, then the targets)."""
    rows = peer_rows(data)
    P = data.get("world_size")
    lines = [f"Device bench: {P} ranks, `{data.get('command', 'commlib bench')}`; NCCL peer: "
             f"{', '.join(sorted({r['peer'] for r in rows})) or 'none'}. Time = median of the slowest rank's "
             "per-call time (enqueue + stream synchronize); busbw as nccl-tests.", "",
             "| collective | size | mode | our best | ours µs | NCCL µs | NCCL/ours time | ours GB/s | NCCL GB/s | ours/NCCL busbw |",
             "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    from commlib.perf.common import fmt_bytes
    for r in rows:
        lines.append(f"| {r['collective']} | {fmt_bytes(r['bytes'])} | {r['mode']} | {r['best']} | {r['ours_us']:.1f} | "
                     f"{r['nccl_us']:.1f} | {r['time_ratio']:.2f} | {r['ours_busbw']:.2f} | {r['nccl_busbw']:.2f} | "
                     f"{r['busbw_ratio']:.2f} |")
    lines += ["", "| target | status |", "| --- | --- |"]
    lines += [f"| {t} | {v} |" for t, v in targets(rows, P)]
    from commlib.bench.device_paths import markdown as paths_markdown
    paths = paths_markdown(data)
    return "\n".join(lines) + "\n" + ("\n" + paths if paths else "")


if __name__ == "__main__":
    import json
    import sys
    with open(sys.argv[1]) as f:
        sys.stdout.write(markdown(json.load(f)))
