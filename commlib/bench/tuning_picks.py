"""Measured records to picks: an algorithm's time per (collective, world size, size) as the median
over modes and runs, and a tuning section of measured entries from them. Shared by the host rows
(commlib/bench/tuning.py) and the device's (commlib/bench/device_tuning.py)."""
from __future__ import annotations

import math

from commlib.perf.tuning_path import choose_path, rows


def usual_mode(records):
    """The commlib records a table's rows are tuned from: at each (collective, P, bytes), those of the
    mode that collective's usual call takes (commlib.perf.common.COMPARE_MODE: torch's all_reduce and
    broadcast in place, the others out of place), where there are any; else every mode's.

    The core picks one algorithm per size whatever the mode, and some algorithms rank differently in
    place (all_reduce 2 MiB on the Intel Xeon VMs: ring 1.03x the best in place, 1.18x out of place), so
    a table tuned from both modes served neither the usual call nor T5, which judges that mode: over
    fourteen main-job runs of that class, tables tuned from thirteen missed 1.71 points a run on the
    fourteenth from both modes, 1.14 from the usual mode (bench/RESULTS_collectives.md, session 40).
    Other backends' records pass through."""
    from commlib.perf.common import COMPARE_MODE
    usual = {(r["collective"], r["world_size"], r["bytes"]) for r in records
             if r["backend"] == "commlib" and r.get("mode") == COMPARE_MODE.get(r["collective"])}
    return [r for r in records if r["backend"] != "commlib" or r.get("mode") == COMPARE_MODE.get(r["collective"])
            or (r["collective"], r["world_size"], r["bytes"]) not in usual]


# A time more than this over its run's best counts as this much: one slow spell of one algorithm in
# one run then moves its mean by a bounded step, not by the spell's own size (2.5x auto's T5 tolerance).
RATIO_CAP = 1.25


def relative_times(records):
    """{(collective, P, bench bytes): {algorithm: relative time}} of commlib records: each time over
    the best named algorithm's in the same run and mode (a group: records that ran minutes apart),
    capped at RATIO_CAP, then the geometric mean of those ratios over the groups. Auto's records that
    ran the flags (``resolved`` "flags") are "flags" there, judged against the same best.

    Why ratios within a group: the machines drift (the same algorithm's row 1.7x apart between runs
    minutes apart, bench/RESULTS_collectives.md session 38), so raw times of several runs merged
    (their median: `commlib tune` until session 40) compare one algorithm's fast spell with another's
    slow one. On eight main-job runs of the Intel Xeon class, tables tuned from seven runs and judged
    on the eighth missed T5 1.50 times a run this way against 2.25 with merged medians
    (bench/RESULTS_collectives.md, session 40). A run is a record's ``run`` (commlib.bench.tuning.from_runs
    sets it); records without one are one run.
    """
    groups = {}
    for r in records:
        if r["backend"] != "commlib":
            continue
        name = r["algorithm"]
        if name == "auto":
            if r.get("resolved") != "flags":
                continue
            name = "flags"
        key = (r["collective"], r["world_size"], r["bytes"])
        groups.setdefault(key, {}).setdefault((r.get("run"), r.get("mode")), []).append(
            (name, r["time_us"]["median"]))
    out = {}
    for key, by_group in groups.items():
        logs = {}
        for recs in by_group.values():
            named = [t for a, t in recs if a != "flags"]
            if not named or min(named) <= 0:
                continue
            best = min(named)
            for a, t in recs:
                logs.setdefault(a, []).append(min(math.log(t / best), math.log(RATIO_CAP)))
        out[key] = {a: math.exp(sum(v) / len(v)) for a, v in logs.items()}
    return out


def measured_picks(records, rel=None):
    """{(collective, P): [(bench_bytes, core_bytes, {algorithm: relative time})]} from commlib records
    (several runs' may be passed together): each named algorithm's time relative to the best of its
    run and mode (``rel``: relative_times of the same records, computed here when not given). Only
    their ratios at one size mean anything (choose_path's)."""
    from commlib.perf.common import core_bytes
    rel = relative_times(records) if rel is None else rel
    acc = {}
    for r in records:
        if r["backend"] != "commlib" or r["algorithm"] == "auto":
            continue
        key = (r["collective"], r["world_size"])
        acc.setdefault(key, {}).setdefault(r["bytes"], core_bytes(r["collective"], r["bytes"], r["dtype"],
                                                                  r["world_size"]))
    out = {}
    for (coll, P), by_size in acc.items():
        out[(coll, P)] = [(b, cb, {a: t for a, t in rel.get((coll, P, b), {}).items() if a != "flags"})
                          for b, cb in sorted(by_size.items())]
    return out


def measured_seconds(records):
    """{(collective, P): [(bench_bytes, core_bytes, {algorithm: seconds})]}: each algorithm's median
    of its records' medians (over modes and runs). For comparing two paths' absolute times (the
    device's kernel and copy paths: device_tuning.device_path_section); picks use measured_picks."""
    from commlib.perf.common import core_bytes
    acc = {}
    for r in records:
        if r["backend"] != "commlib" or r["algorithm"] == "auto":
            continue
        per = acc.setdefault((r["collective"], r["world_size"]), {}).setdefault(r["bytes"], {
            "core": core_bytes(r["collective"], r["bytes"], r["dtype"], r["world_size"]), "t": {}})
        per["t"].setdefault(r["algorithm"], []).append(r["time_us"]["median"] * 1e-6)
    return {key: [(b, v["core"], {a: _median(ts) for a, ts in v["t"].items()}) for b, v in sorted(by_size.items())]
            for key, by_size in acc.items()}


def _median(xs):
    xs = sorted(xs)
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def flag_sizes(records):
    """{(collective, P, bench bytes)} where every auto record ran the flags (``resolved`` "flags":
    host/lowering.cc flag_route, ahead of the table)."""
    seen = {}
    for r in records:
        if r["backend"] == "commlib" and r["algorithm"] == "auto":
            key = (r["collective"], r["world_size"], r["bytes"])
            seen[key] = seen.get(key, True) and r.get("resolved") == "flags"
    return {k for k, every in seen.items() if every}


def flagged_at(flags, collective, P):
    """The bench bytes of ``flags`` (flag_sizes') at one (collective, world size)."""
    return {b for c, q, b in flags if (c, q) == (collective, P)}


def choose_picks(series, flagged=()):
    """One algorithm per size of ``series`` (measured_picks'), by choose_path. The sizes whose bench
    bytes are in ``flagged`` (the smallest ones: auto ran the flags there) get a path of their own:
    their rows are read only where the flags cannot run (ranks on several hosts, a codec), so they
    must not steer the sizes the table decides. One path over both kept all_to_all on "direct" from
    16 B on the Intel Xeon VMs, its switch cost outweighing pairwise's lead at 32 KiB, the first size
    the table decides there (8-15% in twelve runs of twelve)."""
    times = [t for _, _, t in series]
    k = 0
    while k < len(series) and series[k][0] in flagged:
        k += 1
    if k == 0 or k == len(series):
        return choose_path(times)
    return choose_path(times[:k]) + choose_path(times[k:])


def measured_entries(records, previous_section):
    """A section of measured entries ({collective: {P: entry}}) from ``records`` (one algorithm
    pick per size: choose_path), keeping ``previous_section``'s measured entries of world sizes
    these records do not measure. The kernel path's section: its rows are read only for device
    calls that the kernel path runs, on one host (docs/gpu.md "auto on the device")."""
    section = {coll: {P: e for P, e in per.items() if e.get("source", "measured") == "measured"}
               for coll, per in (previous_section or {}).items()}
    flags = flag_sizes(records)
    for (coll, P), series in sorted(measured_picks(records).items()):
        if not series:
            continue
        best = choose_picks(series, flagged_at(flags, coll, P))
        section.setdefault(coll, {})[str(P)] = {
            "source": "measured", "dtype": next(r["dtype"] for r in records if r["collective"] == coll),
            "rows": rows([cb for _, cb, _ in series], best)}
    return {coll: per for coll, per in section.items() if per}
