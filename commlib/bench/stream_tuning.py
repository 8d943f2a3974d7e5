"""The tuning file's ``"stream"`` section from bench runs: per collective and world size, the call size
(auto's bytes) from which the call's copies measured faster written with streaming (non-temporal)
stores, -1 for never (csrc/policy/stream_stores.h).

``commlib bench --stream-ab`` runs commlib's job once per side (stream_ab.py): records named
``<algorithm>@nt0`` (no call streams) and ``<algorithm>@nt1`` (every call streams). At every size each
side's time is its best named algorithm's in the mode of the collective's usual call (as the rows,
tuning_picks.usual_mode), and the sides are compared run by run: the streaming side's time over the
other's, geometric mean over the runs (the machine drifts between runs, not between the two jobs of
one). The entry is the smallest size from which streaming was faster by more than STREAM_MARGIN at it
and at every larger size; -1 when it was not at the largest. A tie goes to plain stores: they leave the
call's output in the cache for whatever reads it next, which the bench does not time. Below the sizes it touches (messages under 64 KiB, the
flags) both sides run the same code, and the scan down from the largest size stops at the first ratio
the noise puts over 1: which side such small calls take makes no difference.

The algorithm rows then come from the records of the side the entry gives each size (:func:`choose`):
an A/B run's records of that side, and a main-job run's records when the side they ran on
(:func:`side_ran`, from the run's ``stream_in_force``) is that one.
"""
from __future__ import annotations

import math

from commlib.core import tuning
from commlib.perf.common import COLLECTIVES, core_bytes, elem_size, geometry

NEVER = -1
# Streaming must beat plain stores by more than this (3%, as the flags' margin, flag_tuning.py): the
# two sides' ratio at a size where they run the same code wanders this far between runs.
STREAM_MARGIN = 0.03
DEFAULT_FOOTPRINT = 32 << 20  # COMMLIB_STREAM_BYTES's default (csrc/host/executor.h)
ROOT_OUTPUT_IS_BLOCK = frozenset(("reduce_scatter", "scatter"))  # the root's output: one rank's block


def _side_bests(records):
    """{(collective, P): {core bytes: {run: {side: best seconds}}}} of the A/B runs' commlib records
    (auto's excluded), in the usual call's mode."""
    from commlib.bench.tuning_picks import usual_mode
    ab = [r for r in records if r.get("stream_stores") in ("0", "1") and r["backend"] == "commlib"
          and r["algorithm"] != "auto" and not r.get("wrong")]
    out = {}
    for r in usual_mode(ab):
        cb = core_bytes(r["collective"], r["bytes"], r["dtype"], r["world_size"])
        per = out.setdefault((r["collective"], r["world_size"]), {}).setdefault(cb, {}).setdefault(r.get("run", 0), {})
        t = r["time_us"]["median"] * 1e-6
        side = r["stream_stores"]
        per[side] = min(per.get(side, t), t)
    return out


def ratios(records):
    """{(collective, P): {core bytes: streaming's time over the other side's}}, geometric mean over the
    runs that measured both sides at that size."""
    out = {}
    for key, sizes in _side_bests(records).items():
        for cb, runs in sizes.items():
            logs = [math.log(s["1"] / s["0"]) for s in runs.values() if "0" in s and "1" in s and s["0"] > 0]
            if logs:
                out.setdefault(key, {})[cb] = math.exp(sum(logs) / len(logs))
    return out


def starts(records):
    """{(collective, P): the smallest call size that streams, or NEVER} where A/B records measured both
    sides."""
    out = {}
    for key, per in ratios(records).items():
        start = NEVER
        for cb in sorted(per, reverse=True):  # from the largest down, while streaming keeps winning
            if per[cb] >= 1.0 - STREAM_MARGIN:
                break
            start = cb
        out[key] = start
    return out


def footprint(collective, bench_bytes, dtype, P) -> int:
    """The bytes of a call's outputs on every rank together, as the core reckons them (the root's
    output times the world size, csrc/host/lowering.cc)."""
    count, block, _ = geometry(collective, bench_bytes, dtype, P)
    return (block if collective in ROOT_OUTPUT_IS_BLOCK else count) * elem_size(dtype) * P


def side_ran(record, in_force):
    """The side ("0" or "1") a main-job record's call ran on, from ``in_force``: the "stream" section its
    run's ranks loaded (its config's ``stream_in_force``). As the core decides (policy/stream_stores.h):
    the entry of its collective and world size where there is one, else the 32 MiB footprint rule ({}: the
    rule alone, as a run whose config predates the record ran). None where ``in_force`` is None (its run
    set COMMLIB_STREAM_BYTES, or read no tuning) or the collective is none the core knows."""
    if in_force is None or record["collective"] not in COLLECTIVES:
        return None
    coll, P = record["collective"], int(record["world_size"])
    start = tuning.streaming_starts({"stream": in_force}).get(coll, {}).get(P)
    if start is not None:
        return "1" if start >= 0 and core_bytes(coll, record["bytes"], record["dtype"], P) >= start else "0"
    return "1" if footprint(coll, record["bytes"], record["dtype"], P) >= DEFAULT_FOOTPRINT else "0"


def choose(records, previous=None):
    """(records for the algorithm rows, the "stream" section). Without A/B runs the records are returned
    as they are and ``previous``'s section is kept; entries of world sizes or collectives the runs did
    not compare are kept too."""
    section = {c: dict(per) for c, per in ((previous or {}).get("stream") or {}).items()}
    found = starts(records)
    if not found:
        return records, section
    picked = []
    for r in records:
        key = (r["collective"], r["world_size"])
        side = r.get("stream_stores", r.get("stream_ran"))
        if key not in found or r["backend"] != "commlib" or side is None:
            picked.append(r)
            continue
        start = found[key]
        on = start != NEVER and core_bytes(r["collective"], r["bytes"], r["dtype"], r["world_size"]) >= start
        if side == ("1" if on else "0"):
            picked.append(r)
    for (coll, P), start in found.items():
        section.setdefault(coll, {})[str(P)] = {"min_bytes": int(start)}
    return picked, section
