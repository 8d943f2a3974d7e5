"""The kernel path's trace (``COMMLIB_DEVICE_TRACE=1``, issue #38 item 6) as a timeline: per rank,
per block, per step, in the bench's trace format, the Chrome trace (Perfetto, ``chrome://tracing``)
that ``commlib.parallel.pipeline.timeline`` writes for pipeline steps: one process per rank, one
thread per block, one complete ("X") slice per step, microseconds.

The kernel stamps each block's steps with the device's clock (``%globaltimer``; on the emulated
device the host's monotonic clock), so ranks on one device, or one host's devices, compare
directly. :func:`rank_trace` reads this rank's records of the last device collective (after it
completed), :func:`write_trace` writes every rank's, :func:`read_trace` reads a written trace back
into records (what tests and ``bench/gpu_trace.py`` check), :func:`step_table` summarises it.
"""
from __future__ import annotations

import json
from typing import Dict, List

__all__ = ["rank_trace", "chrome_trace", "write_trace", "read_trace", "step_table"]

_FIELDS = ("rank", "block", "step", "start_ns", "end_ns")


def rank_trace(comm) -> List[dict]:
    """This rank's records of the last device collective on ``comm``: ``{rank, block, step,
    start_ns, end_ns}`` per block and step, in that order (``[]`` unless the engine was made with
    ``COMMLIB_DEVICE_TRACE=1`` and ran a kernel-path call). Call after the collective completed."""
    return [dict(zip(_FIELDS, (comm.rank, *r))) for r in comm._device().kernel_trace()]


def chrome_trace(records: List[dict], name: str = "kernel path") -> Dict:
    """A Chrome-trace document of ``records`` (any ranks'): times from the earliest start, in µs."""
    if not records:
        return {"traceEvents": [], "displayTimeUnit": "ns"}
    t0 = min(r["start_ns"] for r in records)
    events = []
    for rank in sorted({r["rank"] for r in records}):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"{name}: rank {rank}"}})
        for block in sorted({r["block"] for r in records if r["rank"] == rank}):
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": block,
                           "args": {"name": f"block {block}"}})
    for r in records:
        events.append({"name": f"step {r['step']}", "cat": "step", "ph": "X", "pid": r["rank"], "tid": r["block"],
                       "ts": (r["start_ns"] - t0) / 1e3, "dur": (r["end_ns"] - r["start_ns"]) / 1e3,
                       "args": {"step": r["step"], "start_ns": r["start_ns"], "end_ns": r["end_ns"]}})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_trace(records: List[dict], path: str, name: str = "kernel path") -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(records, name), f)


def read_trace(path: str) -> List[dict]:
    """The records of a trace :func:`write_trace` wrote (its step slices; metadata skipped), sorted
    by rank, block and step. ValueError naming the file when it is not such a trace."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents list)")
    out = []
    for e in doc["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") != "step":
            continue
        a = e.get("args", {})
        if "step" not in a or "start_ns" not in a or "end_ns" not in a:
            raise ValueError(f"{path}: a step slice without step, start_ns and end_ns: {e}")
        out.append({"rank": e["pid"], "block": e["tid"], "step": a["step"], "start_ns": a["start_ns"],
                    "end_ns": a["end_ns"]})
    return sorted(out, key=lambda r: (r["rank"], r["block"], r["step"]))


def step_table(records: List[dict]) -> str:
    """Markdown: per step, its fastest and slowest (rank, block) duration and when the last one
    ended (µs from the earliest start): where a launch's time goes, and how uneven its blocks are."""
    if not records:
        return "(no trace records: COMMLIB_DEVICE_TRACE=1 and a kernel-path call needed)\n"
    t0 = min(r["start_ns"] for r in records)
    lines = ["| step | (rank, block)s | fastest µs | slowest µs | last end µs |", "| ---: | ---: | ---: | ---: | ---: |"]
    for step in sorted({r["step"] for r in records}):
        rs = [r for r in records if r["step"] == step]
        d = [(r["end_ns"] - r["start_ns"]) / 1e3 for r in rs]
        lines.append(f"| {step} | {len(rs)} | {min(d):.1f} | {max(d):.1f} | "
                     f"{(max(r['end_ns'] for r in rs) - t0) / 1e3:.1f} |")
    return "\n".join(lines) + "\n"
