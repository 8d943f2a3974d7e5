"""The report's "At scale" section, from ``commlib sim --json`` files (commlib/bench/report.py calls
:func:`add_at_scale`): per collective and topology, the predicted winner per (message size x rank
count) as a heat map and a table, the crossover sizes per rank count, flat vs hierarchical where
``hierarchical`` was simulated, predicted busbw curves, and predictions beside measurements where a
bench file has the same (collective, algorithm, ranks, size)."""
from __future__ import annotations

import os

from commlib.perf import common as C

__all__ = ["is_sim", "add_at_scale", "winners", "crossovers"]

SCHEMA = "commlib-sim/1"


def is_sim(data) -> bool:
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def validate(data) -> list:
    errs = []
    if not isinstance(data.get("results"), list):
        errs.append("no 'results' list")
    for i, r in enumerate(data.get("results") or []):
        miss = [k for k in ("collective", "algorithm", "world_size", "bytes", "time_us", "busbw_GBps") if k not in r]
        if miss:
            errs.append(f"results[{i}] lacks {', '.join(miss)}")
            break
    return errs


def _groups(records):
    out = {}
    for r in records:
        out.setdefault((r["transport"], r["collective"]), []).append(r)
    return out


def winners(records) -> dict:
    """{(ranks, bytes): (algorithm, microseconds)}: the fastest predicted algorithm (auto excluded)."""
    best = {}
    for r in records:
        if r["algorithm"] == "auto":
            continue
        key, t = (r["world_size"], r["bytes"]), r["time_us"]["median"]
        if key not in best or t < best[key][1]:
            best[key] = (r["algorithm"], t)
    return best


def crossovers(win: dict, ranks: int) -> list:
    """[(bytes, from, to)] where the winner changes along the sizes of one rank count."""
    row = sorted((b, a) for (P, b), (a, _) in win.items() if P == ranks)
    return [(b, prev, a) for (_, prev), (b, a) in zip(row, row[1:]) if a != prev]


def _heatmap(plt, win, title, path):
    Ps = sorted({P for P, _ in win})
    sizes = sorted({b for _, b in win})
    algs = sorted({a for a, _ in win.values()})
    import numpy as np
    grid = np.full((len(Ps), len(sizes)), np.nan)
    for (P, b), (a, _) in win.items():
        grid[Ps.index(P), sizes.index(b)] = algs.index(a)
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(sizes) + 3), max(2.5, 0.45 * len(Ps) + 1.5)))
    from matplotlib.colors import ListedColormap
    cmap = ListedColormap([plt.get_cmap("tab10")(i % 10) for i in range(max(len(algs), 1))])
    ax.imshow(grid, aspect="auto", cmap=cmap, vmin=-0.5, vmax=len(algs) - 0.5, origin="lower")
    ax.set_xticks(range(len(sizes)), [C.fmt_bytes(b) for b in sizes], rotation=60, fontsize=7)
    ax.set_yticks(range(len(Ps)), [str(P) for P in Ps], fontsize=8)
    ax.set_xlabel("message size")
    ax.set_ylabel("ranks")
    ax.set_title(title, fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(i)) for i in range(len(algs))]
    ax.legend(handles, algs, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _busbw_plot(plt, recs, title, path):
    Ps = sorted({r["world_size"] for r in recs})
    fig, axes = plt.subplots(1, len(Ps), figsize=(4 * len(Ps), 3.2), squeeze=False)
    for ax, P in zip(axes[0], Ps):
        by_alg = {}
        for r in recs:
            if r["world_size"] == P and r["algorithm"] != "auto":
                by_alg.setdefault(r["algorithm"], []).append((r["bytes"], r["busbw_GBps"]))
        for alg, pts in sorted(by_alg.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=alg)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{P} ranks", fontsize=9)
        ax.set_xlabel("bytes")
        ax.set_ylabel("predicted busbw (GB/s)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def add_at_scale(doc, sims, outdir, measured=(), plt=None):
    """Appends the "At scale" section for the sim files ``sims`` to the report ``doc``."""
    records = [r for d in sims for r in d["results"]]
    if not records:
        return
    doc.h("At scale (simulated)")
    doc.p("Predictions of `commlib sim`: the registered schedules played by the simulator on a modelled "
          "cluster (docs/simulator.md; validation in bench/RESULTS_sim.md). Commands: "
          + "; ".join(f"`{d.get('command', 'commlib sim')}`" for d in sims) + ".")
    for (topo, coll), recs in sorted(_groups(records).items()):
        win = winners(recs)
        Ps = sorted({P for P, _ in win})
        sizes = sorted({b for _, b in win})
        doc.h(f"{coll} on {topo}", 3)
        if plt is not None and win:
            path = os.path.join(outdir, f"sim_{topo.replace(':', '_').replace('/', '_')}_{coll}_winners.png")
            _heatmap(plt, win, f"{coll} on {topo}: fastest predicted algorithm", path)
            doc.img(path, f"winner per size and ranks, {coll} on {topo}")
            path = os.path.join(outdir, f"sim_{topo.replace(':', '_').replace('/', '_')}_{coll}_busbw.png")
            _busbw_plot(plt, recs, f"{coll} on {topo}: predicted bus bandwidth", path)
            doc.img(path, f"predicted busbw, {coll} on {topo}")
        doc.table(["ranks"] + [C.fmt_bytes(b) for b in sizes],
                  [[P] + [win.get((P, b), ("–", 0))[0] for b in sizes] for P in Ps])
        doc.table(["ranks", "crossovers (size: from -> to)"],
                  [[P, "; ".join(f"{C.fmt_bytes(b)}: {a} -> {z}" for b, a, z in crossovers(win, P)) or "none"]
                   for P in Ps])
        _flat_vs_hier(doc, recs, Ps, sizes)
    _beside_measured(doc, records, measured)


def _flat_vs_hier(doc, recs, Ps, sizes):
    t = {(r["algorithm"], r["world_size"], r["bytes"]): r["time_us"]["median"] for r in recs}
    if not any(a == "hierarchical" for a, _, _ in t):
        return
    rows = []
    for P in Ps:
        for b in sizes:
            flat = [v for (a, q, s), v in t.items() if q == P and s == b and a not in ("hierarchical", "auto")]
            h = t.get(("hierarchical", P, b))
            if flat and h:
                rows.append([P, C.fmt_bytes(b), f"{min(flat):.1f}", f"{h:.1f}", f"{min(flat) / h:.2f}x"])
    doc.table(["ranks", "size", "best flat µs", "hierarchical µs", "hierarchical speed-up"], rows)


def _beside_measured(doc, records, measured):
    pred = {(r["collective"], r["algorithm"], r["world_size"], r["bytes"]): r for r in records}
    rows = []
    for m in measured:
        p = pred.get((m["collective"], m["algorithm"], m["world_size"], m["bytes"]))
        if p is None or m.get("backend") != "commlib":
            continue
        mt, pt = m["time_us"]["median"], p["time_us"]["median"]
        rows.append([m["collective"], m["algorithm"], m["world_size"], C.fmt_bytes(m["bytes"]), f"{mt:.2f}",
                     f"{pt:.2f}", f"{(pt - mt) / mt * 100:+.0f}%", p["transport"]])
    if rows:
        doc.h("Predicted beside measured", 3)
        doc.table(["collective", "algorithm", "ranks", "size", "measured µs", "predicted µs", "error", "topology"],
                  rows)
