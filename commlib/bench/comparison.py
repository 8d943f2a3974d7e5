"""commlib against its peers in one run: each collective's records in its comparison mode
(common.COMPARE_MODE), the best algorithm, auto and the peers at each size, and where the best
algorithm changes. Shared by the report, the summary at the end of a run and bench/ scripts."""
from __future__ import annotations

from commlib.perf import common as C


def compare_records(records):
    """Records in each collective's comparison mode (see common.COMPARE_MODE); compressed calls
    (--compress) are compared apart, against the uncompressed ones (report_compression.py)."""
    return [r for r in records if r["mode"] == C.COMPARE_MODE[r["collective"]] and not r.get("compress")]


def index_by_series(records):
    """{(collective, P): {series: {bytes: record}}}; series = algorithm for commlib, backend else."""
    out = {}
    for r in compare_records(records):
        s = r["algorithm"] if r["backend"] == "commlib" else r["backend"]
        out.setdefault((r["collective"], r["world_size"]), {}).setdefault(s, {})[r["bytes"]] = r
    return out


def median_us(rec):
    """A record's median time in µs (None for no record)."""
    return rec["time_us"]["median"] if rec else None


def comparison(records):
    """Rows per (collective, P, bytes): best commlib, auto, gloo, mpi (median us) and ratios."""
    rows = []
    by_order = lambda kv: (C.COLLECTIVES.index(kv[0][0]), kv[0][1])  # noqa: E731
    for (coll, P), series in sorted(index_by_series(records).items(), key=by_order):
        sizes = sorted({b for s in series.values() for b in s})
        for b in sizes:
            algs = {a: v[b] for a, v in series.items()
                    if a not in ("auto", "gloo", "mpi") and not a.startswith("nccl") and b in v}  # peers
            auto = series.get("auto", {}).get(b)
            if auto and auto.get("resolved") == "flags":
                # auto's small broadcast and barrier run the shared-memory flags, a path no named
                # algorithm takes (docs/transports.md "Flag calls"): a candidate for commlib's best,
                # under that name, so the peers are compared with what commlib's default call runs.
                algs = dict(algs, flags=auto)
            if not algs:
                continue
            best = min(algs, key=lambda a: median_us(algs[a]))
            rows.append({
                "collective": coll, "world_size": P, "bytes": b, "best": best,
                "best_us": median_us(algs[best]), "best_busbw": algs[best]["busbw_GBps"],
                "auto_us": median_us(series.get("auto", {}).get(b)),
                "auto_resolved": (series.get("auto", {}).get(b) or {}).get("resolved"),
                "gloo_us": median_us(series.get("gloo", {}).get(b)), "mpi_us": median_us(series.get("mpi", {}).get(b)),
                "gloo_busbw": (series.get("gloo", {}).get(b) or {}).get("busbw_GBps"),
                "mpi_busbw": (series.get("mpi", {}).get(b) or {}).get("busbw_GBps"),
                "times": {a: median_us(r) for a, r in algs.items()},
            })
    return rows


def peer_ratio(peer, ours):
    """A peer's time over commlib's (above 1: commlib is faster); None when either is missing."""
    return peer / ours if peer and ours else None


def measured_crossovers(rows):
    """{(coll, P): 'alg1 → alg2 at 4 KiB, ...'} where the measured best algorithm changes."""
    out = {}
    for r in rows:
        key = (r["collective"], r["world_size"])
        out.setdefault(key, []).append((r["bytes"], r["best"]))
    text = {}
    for key, seq in out.items():
        parts, prev = [], None
        for b, a in seq:
            if prev is None:
                parts.append(a)
            elif a != prev:
                parts.append(f"→ {a} from {C.fmt_bytes(b)}")
            prev = a
        text[key] = " ".join(parts)
    return text
