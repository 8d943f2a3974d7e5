"""Measured records to picks: an algorithm's time per (collective, world size, size) as the median
over modes and runs, and a tuning section of measured entries from them. Shared by the host rows
(commlib/bench/tuning.py) and the device's (commlib/bench/device_tuning.py)."""
from __future__ import annotations

from commlib.perf.tuning_path import choose_path, rows


def measured_picks(records):
    """{(collective, P): [(bench_bytes, core_bytes, {algorithm: seconds})]} from commlib records.

    An algorithm's time at a size is the median of its medians over the modes and runs measured
    (records of several runs may be passed together: one noisy run then does not decide).
    """
    from commlib.perf.common import core_bytes
    acc = {}
    for r in records:
        if r["backend"] != "commlib" or r["algorithm"] == "auto":
            continue
        key = (r["collective"], r["world_size"])
        per = acc.setdefault(key, {}).setdefault(r["bytes"], {"core": core_bytes(
            r["collective"], r["bytes"], r["dtype"], r["world_size"]), "t": {}})
        per["t"].setdefault(r["algorithm"], []).append(r["time_us"]["median"] * 1e-6)
    out = {}
    for key, by_size in acc.items():
        out[key] = [(b, v["core"], {a: _median(ts) for a, ts in v["t"].items()})
                    for b, v in sorted(by_size.items())]
    return out


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


def _median(xs):
    xs = sorted(xs)
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


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
