"""The report's "Compressed collectives" section (``commlib bench --compress``): each codec's calls
against the uncompressed ones of the same run, at each size; a plot of time vs size per codec.

Two ratios per row: against the same algorithm uncompressed (what the codec buys that schedule)
and against the fastest uncompressed algorithm at that size (what a user gains over their best
option). Effective bandwidth counts the uncompressed bytes (the data the caller reduces), so it
can exceed the link's rate."""
from __future__ import annotations

import os

from commlib.perf import common as C
from commlib.bench.report_format import fmt_num, fmt_ratio, fmt_us

NOTE = ("Ratios are uncompressed time / compressed time (above 1× the codec is faster). Results are checked "
        "within the codec's stated bound (docs/compression.md), not exactly. Effective busbw counts the "
        "uncompressed bytes.")


def _key(r):
    return r["collective"], r["world_size"], r["bytes"], r["mode"]


def compression_rows(records):
    """One row per compressed record in its collective's comparison mode, with its uncompressed peers."""
    plain = {}
    for r in records:
        if not r.get("compress") and r["backend"] == "commlib":
            plain.setdefault(_key(r), {})[r["algorithm"]] = r["time_us"]["median"]
    rows = []
    for r in records:
        if not r.get("compress") or r["mode"] != C.COMPARE_MODE[r["collective"]]:
            continue
        same = plain.get(_key(r), {})
        algo = r["algorithm"].partition("+")[0]
        best = min((t for a, t in same.items() if a != "auto"), default=None)
        t = r["time_us"]["median"]
        rows.append({"collective": r["collective"], "ranks": r["world_size"], "bytes": r["bytes"], "algorithm": algo,
                     "resolved": r.get("resolved"), "codec": r["compress"], "us": t, "plain_us": same.get(algo),
                     "best_plain_us": best, "busbw": r.get("busbw_GBps"), "wrong": r.get("wrong")})
    return sorted(rows, key=lambda x: (C.COLLECTIVES.index(x["collective"]), x["ranks"], x["bytes"], x["codec"],
                                       x["algorithm"]))


def add_compression(doc, records, outdir, plt=None):
    rows = compression_rows(records)
    if not rows:
        return
    doc.h("Compressed collectives (--compress)")
    doc.p(NOTE)
    doc.table(["collective", "ranks", "size", "algorithm", "codec", "compressed µs", "same algorithm µs",
               "speed-up", "best uncompressed µs", "speed-up vs best", "effective busbw GB/s", "wrong"],
              [[x["collective"], x["ranks"], C.fmt_bytes(x["bytes"]),
                x["algorithm"] + (f" ({x['resolved']})" if x["algorithm"] == "auto" and x["resolved"] else ""),
                x["codec"], fmt_us(x["us"]), fmt_us(x["plain_us"]),
                fmt_ratio(x["plain_us"] / x["us"] if x["plain_us"] and x["us"] else None), fmt_us(x["best_plain_us"]),
                fmt_ratio(x["best_plain_us"] / x["us"] if x["best_plain_us"] and x["us"] else None),
                fmt_num(x["busbw"]), x["wrong"] if x["wrong"] is not None else "–"] for x in rows])
    if plt is None:
        return
    for (coll, P) in sorted({(x["collective"], x["ranks"]) for x in rows},
                            key=lambda k: (C.COLLECTIVES.index(k[0]), k[1])):
        sel = [x for x in rows if x["collective"] == coll and x["ranks"] == P]
        fig, ax = plt.subplots(figsize=(6, 4))
        sizes = sorted({x["bytes"] for x in sel})
        best_plain = {x["bytes"]: x["best_plain_us"] for x in sel}
        ax.plot(sizes, [best_plain[b] for b in sizes], color="black", lw=2, label="uncompressed (best algorithm)")
        for codec in sorted({x["codec"] for x in sel}):
            best = {}
            for x in sel:
                if x["codec"] == codec:
                    best[x["bytes"]] = min(best.get(x["bytes"], float("inf")), x["us"])
            ax.plot(sorted(best), [best[b] for b in sorted(best)], marker="o", ms=3, label=f"{codec} (best algorithm)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("median µs per call")
        ax.set_title(f"{coll}, {P} ranks: compressed vs uncompressed")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(outdir, f"compress_{coll}_P{P}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        doc.img(path, f"{coll} time vs size per codec, {P} ranks")
