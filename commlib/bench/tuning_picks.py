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
    for (coll, P), series in sorted(measured_picks(records).items()):
        if not series:
            continue
        best = choose_path([t for _, _, t in series])
        section.setdefault(coll, {})[str(P)] = {
            "source": "measured", "dtype": next(r["dtype"] for r in records if r["collective"] == coll),
            "rows": rows([cb for _, cb, _ in series], best)}
    return {coll: per for coll, per in section.items() if per}
