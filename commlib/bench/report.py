"""``commlib report``: one self-contained HTML page and its Markdown twin from bench JSON files.

    commlib report out.json [more.json ...] -o report/

writes report/index.html (plots embedded as base64 PNG), report/report.md (same content, PNGs
linked) and the PNGs: busbw and latency vs size per algorithm (log axes, one panel per
collective, peers and memcpy overlaid), measured vs fitted model, then tables of crossover sizes,
auto's picks, commlib vs gloo vs MPI ratios at each size, fitted alpha/beta/gamma, correctness, and
the machine and versions. Every comparison is in one mode per collective (common.COMPARE_MODE: the
form every backend has) and between numbers of the same run.
"""
from __future__ import annotations

import base64
import html
import json
import os
import re

from commlib.bench import common as C
from commlib.bench import model as M
from commlib.bench.memcpy import largest as memcpy_largest

BUSBW_NOTE = (
    "How to read busbw: algbw is size / time. busbw multiplies it by the bytes each rank must move "
    "per byte of result for a bandwidth-optimal algorithm (all_reduce 2(P-1)/P, all_gather, "
    "reduce_scatter and all_to_all (P-1)/P, broadcast 1), so it is comparable across collectives and "
    "world sizes and against the hardware: on one host, read it against the one-thread memcpy "
    "bandwidth. Times are medians over iterations of the slowest rank's time per call; ratios "
    "compare numbers of the same run (shared machines make absolute numbers noisy, ratios less so).")

PEER_STYLE = {"gloo": dict(color="tab:red", ls="--", marker="s"),
              "mpi": dict(color="tab:purple", ls="--", marker="D")}


# -- loading -------------------------------------------------------------------------------------------
RECORD_KEYS = ("backend", "transport", "collective", "algorithm", "mode", "world_size", "dtype", "op",
               "bytes", "count", "iters", "time_us", "algbw_GBps", "busbw_GBps", "wrong")
TOP_KEYS = ("schema", "machine", "config", "world_size", "backends", "results", "memcpy")


def validate(d) -> list:
    """Problems with a bench JSON (empty when it follows the schema 'commlib-bench/1')."""
    if not isinstance(d, dict):
        return ["not a JSON object"]
    errs = [f"missing key {k!r}" for k in TOP_KEYS if k not in d]
    if d.get("schema") != "commlib-bench/1":
        errs.append(f"schema is {d.get('schema')!r}, expected 'commlib-bench/1'")
    for i, r in enumerate(d.get("results") or []):
        miss = [k for k in RECORD_KEYS if k not in r]
        if miss:
            errs.append(f"results[{i}] lacks {', '.join(miss)}")
        elif not all(k in r["time_us"] for k in ("median", "min", "max")):
            errs.append(f"results[{i}].time_us lacks median/min/max")
        if len(errs) > 10:
            break
    return errs


def load(paths):
    datas = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        from commlib.sim import report as sim_report
        if sim_report.is_sim(d):  # commlib sim --json: the "At scale" section
            errs = sim_report.validate(d)
            if errs:
                raise SystemExit(f"commlib report: {p} is not a commlib sim JSON: {'; '.join(errs[:5])}")
            datas.append(d)
            continue
        errs = validate(d)
        if errs:
            raise SystemExit(f"commlib report: {p} is not a commlib bench JSON: {'; '.join(errs[:5])}")
        datas.append(d)
    return datas


def merged_records(datas):
    return [r for d in datas for r in d["results"]]


def compare_records(records):
    """Records in each collective's comparison mode (see common.COMPARE_MODE)."""
    return [r for r in records if r["mode"] == C.COMPARE_MODE[r["collective"]]]


def _index(records):
    """{(collective, P): {series: {bytes: record}}}; series = algorithm for commlib, backend else."""
    out = {}
    for r in compare_records(records):
        s = r["algorithm"] if r["backend"] == "commlib" else r["backend"]
        out.setdefault((r["collective"], r["world_size"]), {}).setdefault(s, {})[r["bytes"]] = r
    return out


def _t(rec):
    return rec["time_us"]["median"] if rec else None


def comparison(records):
    """Rows per (collective, P, bytes): best commlib, auto, gloo, mpi (median us) and ratios."""
    rows = []
    for (coll, P), series in sorted(_index(records).items(), key=lambda kv: (C.COLLECTIVES.index(kv[0][0]), kv[0][1])):
        sizes = sorted({b for s in series.values() for b in s})
        for b in sizes:
            algs = {a: v[b] for a, v in series.items()
                    if a not in ("auto", "gloo", "mpi") and not a.startswith("nccl") and b in v}  # peers
            if not algs:
                continue
            best = min(algs, key=lambda a: _t(algs[a]))
            rows.append({
                "collective": coll, "world_size": P, "bytes": b, "best": best,
                "best_us": _t(algs[best]), "best_busbw": algs[best]["busbw_GBps"],
                "auto_us": _t(series.get("auto", {}).get(b)),
                "auto_resolved": (series.get("auto", {}).get(b) or {}).get("resolved"),
                "gloo_us": _t(series.get("gloo", {}).get(b)), "mpi_us": _t(series.get("mpi", {}).get(b)),
                "gloo_busbw": (series.get("gloo", {}).get(b) or {}).get("busbw_GBps"),
                "mpi_busbw": (series.get("mpi", {}).get(b) or {}).get("busbw_GBps"),
                "times": {a: _t(r) for a, r in algs.items()},
            })
    return rows


def _ratio(peer, ours):
    return peer / ours if peer and ours else None


# -- formatting helpers -------------------------------------------------------------------------------
def _f(x, spec=".2f", none="–"):
    return none if x is None else format(x, spec)


def _us(x):
    if x is None:
        return "–"
    return f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def _x(r):
    return "–" if r is None else f"{r:.2f}×"


def _availability(datas):
    """{backend: text} across the files (MPI: not available (why))."""
    out = {}
    for d in datas:
        for name, info in d.get("backends", {}).items():
            if info.get("available"):
                out[name] = f"available ({_clean(info.get('library') or info.get('transport', ''))})".replace(" ()", "")
            elif name not in out:
                out[name] = "not requested" if info.get("requested") is False else \
                    f"not available ({info.get('reason') or info.get('error') or 'unknown'})"
    return out


# -- plots ------------------------------------------------------------------------------------------------
def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _panels(n):
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    return rows, cols


def _grid(plt, keys, title):
    rows, cols = _panels(len(keys))
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False)
    fig.suptitle(title, fontsize=12)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def _layout(fig):
    rows = len(fig.axes) and round(fig.get_figheight() / 3.9)
    fig.subplots_adjust(left=0.06, right=0.985, bottom=0.08 if rows > 1 else 0.14, top=0.92 if rows > 1 else 0.86,
                        wspace=0.25, hspace=0.35)


def _size_axis(ax):
    from matplotlib.ticker import FuncFormatter, LogLocator
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=4))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: C.fmt_short(v)))
    ax.set_xlabel("size (bytes)")


def _series_style(name, i):
    if name in PEER_STYLE:
        return dict(PEER_STYLE[name], lw=1.8, ms=4)
    if name == "auto":
        return dict(color="black", lw=2.4, ls="-", marker="", alpha=0.55)
    cmap = _plt().get_cmap("tab10")
    return dict(color=cmap(i % 10), lw=1.3, ls="-", marker="o", ms=3)


def plot_metric(records, memcpy, P, metric, path):
    """busbw or latency vs size, one panel per collective, for world size P."""
    plt = _plt()
    idx = {k: v for k, v in _index(records).items() if k[1] == P}
    colls = [c for c in C.COLLECTIVES if (c, P) in idx]
    if not colls:
        return None
    label = "bus bandwidth (GB/s)" if metric == "busbw" else "time (µs, median)"
    fig, axes = _grid(plt, colls, f"{'Bus bandwidth' if metric == 'busbw' else 'Latency'} vs size — "
                                  f"{P} ranks (commlib algorithms, auto, peers)")
    for ax, coll in zip(axes, colls):
        series = idx[(coll, P)]
        names = sorted(series, key=lambda s: (s in ("auto", "gloo", "mpi"), s))
        for i, name in enumerate(names):
            pts = sorted(series[name].items())
            xs = [b for b, _ in pts]
            ys = [r["busbw_GBps"] if metric == "busbw" else _t(r) for _, r in pts]
            ax.plot(xs, ys, label=name, **_series_style(name, i))
        if metric == "busbw" and memcpy:
            ax.plot([m["bytes"] for m in memcpy], [m["GBps"] for m in memcpy], color="gray", ls=":",
                    lw=1.5, label="memcpy (1 thread)")
        _size_axis(ax)
        ax.set_yscale("log")
        ax.set_title(f"{coll} ({'in-place' if C.COMPARE_MODE[coll] == 'in' else 'out-of-place'})", fontsize=10)
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    _layout(fig)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot_model(records, fits, P, path):
    """Measured (markers) vs fitted model (lines), per collective, commlib algorithms and peers."""
    plt = _plt()
    idx = {k: v for k, v in _index(records).items() if k[1] == P}
    colls = [c for c in C.COLLECTIVES if (c, P) in idx]
    if not colls:
        return None
    fig, axes = _grid(plt, colls, f"Measured (markers) vs alpha-beta-gamma model (lines) — {P} ranks")
    for ax, coll in zip(axes, colls):
        series = idx[(coll, P)]
        names = sorted((s for s in series if s != "auto"), key=lambda s: (s in ("gloo", "mpi"), s))
        for i, name in enumerate(names):
            pts = sorted(series[name].items())
            rec0 = pts[0][1]
            fit = fits.get(f"{rec0['backend']}/{rec0['transport']}/{P}")
            st = _series_style(name, i)
            xs = [b for b, _ in pts]
            ax.plot(xs, [_t(r) for _, r in pts], ls="", marker=st.get("marker") or "o", ms=4,
                    color=st["color"], label=name)
            if fit and fit.get("n"):
                alg = M.model_algorithm(rec0)
                ax.plot(xs, [M.predict(fit, coll, alg, b, P) * 1e6 for b in xs], ls="-" if name not in
                        PEER_STYLE else "--", lw=1.1, color=st["color"])
        _size_axis(ax)
        ax.set_yscale("log")
        ax.set_title(coll, fontsize=10)
        ax.set_ylabel("time (µs)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    _layout(fig)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


# -- sections ---------------------------------------------------------------------------------------------
class Doc:
    """Sections rendered twice: Markdown and HTML."""

    def __init__(self):
        self.items = []

    def h(self, text, level=2):
        self.items.append(("h", level, text))

    def p(self, text):
        self.items.append(("p", text))

    def table(self, headers, rows):
        self.items.append(("table", headers, rows))

    def img(self, path, alt):
        self.items.append(("img", path, alt))

    def pre(self, text):
        self.items.append(("pre", text))

    def markdown(self):
        out = []
        for it in self.items:
            if it[0] == "h":
                out.append("#" * it[1] + " " + it[2])
            elif it[0] == "p":
                out.append(it[1])
            elif it[0] == "pre":
                out.append("```\n" + it[1] + "\n```")
            elif it[0] == "table":
                hdr, rows = it[1], it[2]
                lines = ["| " + " | ".join(hdr) + " |", "|" + "|".join("---" for _ in hdr) + "|"]
                lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
                out.append("\n".join(lines))
            elif it[0] == "img":
                out.append(f"![{it[2]}]({os.path.basename(it[1])})")
            out.append("")
        return "\n".join(out)

    def html(self, title):
        e = html.escape
        body = []
        for it in self.items:
            if it[0] == "h":
                body.append(f"<h{it[1]}>{e(it[2])}</h{it[1]}>")
            elif it[0] == "p":
                body.append(f"<p>{e(it[1])}</p>")
            elif it[0] == "pre":
                body.append(f"<pre>{e(it[1])}</pre>")
            elif it[0] == "table":
                rows = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in it[2])
                body.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in it[1]) + "</tr>" + rows + "</table>")
            elif it[0] == "img":
                with open(it[1], "rb") as f:
                    b64 = base64.b64encode(f.read()).decode()
                body.append(f'<img alt="{e(it[2])}" src="data:image/png;base64,{b64}">')
        css = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}"
               "table{border-collapse:collapse;margin:0.5em 0 1.5em;font-size:13px}"
               "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
               "th{background:#f0f0f0}img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}"
               "pre{background:#f6f6f6;padding:0.6em;overflow-x:auto}")
        return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{e(title)}</title>"
                f"<style>{css}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _measured_crossovers(rows):
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


def build(datas, outdir):
    """The report document (and its PNGs in ``outdir``)."""
    from commlib.sim import report as sim_report
    sims = [d for d in datas if sim_report.is_sim(d)]
    datas = [d for d in datas if not sim_report.is_sim(d)]
    if not datas:  # predictions only
        doc = Doc()
        doc.h("commlib collective report (predictions)", 1)
        sim_report.add_at_scale(doc, sims, outdir, plt=_plt())
        return doc
    records = merged_records(datas)
    fits = {}
    for d in datas:
        fits.update(d.get("model") or M.fit_results(d["results"]))
    memcpy = max((d.get("memcpy") or [] for d in datas), key=lambda m: len(m), default=[])
    rows = comparison(records)
    Ps = sorted({r["world_size"] for r in records})
    doc = Doc()
    doc.h("commlib collective benchmark report", 1)
    avail = _availability(datas)
    doc.p("Commands: " + "; ".join(d.get("command", "commlib bench") for d in datas))
    doc.p(f"World sizes: {', '.join(map(str, Ps)) or 'none'}. Peers: "
          + "; ".join(f"{('MPI' if k == 'mpi' else k)}: {v}" for k, v in sorted(avail.items()) if k != "commlib")
          + (f". One-thread memcpy: {memcpy_largest(memcpy):.2f} GB/s at {C.fmt_bytes(memcpy[-1]['bytes'])}."
             if memcpy else "."))
    wrong = sum(int(r.get("wrong") or 0) for r in records)
    checked = sum(1 for r in records if r.get("wrong") is not None)
    doc.p(f"Correctness: {checked} results checked against a reference, {wrong} wrong values"
          + (" — FAILED" if wrong else " — all correct") + ".")

    # headline: smallest and largest size per collective
    doc.h("Summary: commlib vs gloo vs MPI")
    head = []
    for (coll, P) in sorted({(r["collective"], r["world_size"]) for r in rows},
                            key=lambda k: (C.COLLECTIVES.index(k[0]), k[1])):
        sel = [r for r in rows if r["collective"] == coll and r["world_size"] == P]
        for r in (sel[0], sel[-1]) if len(sel) > 1 else sel:
            head.append([coll, P, C.fmt_bytes(r["bytes"]), f"{_us(r['best_us'])} ({r['best']})", _us(r["auto_us"]),
                         _us(r["gloo_us"]), _us(r["mpi_us"]), _x(_ratio(r["gloo_us"], r["best_us"])),
                         _x(_ratio(r["mpi_us"], r["best_us"])), _f(r["best_busbw"])])
    doc.table(["collective", "ranks", "size", "commlib best µs (algorithm)", "auto µs", "gloo µs", "MPI µs",
               "gloo / commlib", "MPI / commlib", "commlib busbw GB/s"], head)
    doc.p("Ratios are peer time / commlib time: above 1× commlib is faster. " + BUSBW_NOTE)

    for P in Ps:
        doc.h(f"Plots — {P} ranks")
        for metric in ("busbw", "latency"):
            path = plot_metric(records, memcpy, P, metric, os.path.join(outdir, f"{metric}_P{P}.png"))
            if path:
                doc.img(path, f"{metric} vs size, {P} ranks")
        path = plot_model(records, fits, P, os.path.join(outdir, f"model_P{P}.png"))
        if path:
            doc.img(path, f"measured vs model, {P} ranks")

    doc.h("Fitted cost model (alpha, beta, gamma)")
    doc.p("Non-negative least squares on log(time) over every measured size and algorithm of a transport "
          "and world size (the cost model of docs/DESIGN.md and docs/simulator.md; peers fitted as if they ran ring / pairwise / binomial). "
          "On an oversubscribed or shared machine alpha also absorbs scheduling delays.")
    doc.table(["backend", "transport", "ranks", "alpha (µs)", "beta (ns/B)", "1/beta (GB/s)", "gamma (ns/B)",
               "1/gamma (GB/s)", "samples", "median rel. error"],
              [[v["backend"], v["transport"], v["world_size"], _f(v["alpha"] * 1e6), _f(v["beta"] * 1e9, ".4f"),
                _f(1e-9 / v["beta"] if v["beta"] else None), _f(v["gamma"] * 1e9, ".4f"),
                _f(1e-9 / v["gamma"] if v["gamma"] else None), v["n"],
                _f(v["rel_err_median"] * 100 if v["rel_err_median"] is not None else None, ".0f") + "%"]
               for k, v in sorted(fits.items())])

    doc.h("Crossover sizes")
    meas = _measured_crossovers(rows)
    cross = []
    for (coll, P), text in sorted(meas.items(), key=lambda kv: (C.COLLECTIVES.index(kv[0][0]), kv[0][1])):
        algs = sorted({a for r in rows if r["collective"] == coll and r["world_size"] == P for a in r["times"]})
        fit = fits.get(f"commlib/{_transport(records, P)}/{P}")
        mtext = "–"
        if fit and fit.get("n"):
            co = M.crossovers(fit, coll, algs, P, lo=8, hi=1 << 30)
            first = M.best_by_model(fit, coll, algs, 8.0, P)
            mtext = first + "".join(f" → {b} from {C.fmt_approx(n)}" for n, a, b in co)
        cross.append([coll, P, text, mtext])
    doc.table(["collective", "ranks", "measured best algorithm by size", "model's best by size"], cross)

    doc.h("What auto picks")
    doc.p("auto's choice at each size (from the tuning file loaded when the bench ran, or the core's "
          "heuristic), its time against the best algorithm measured at that size; target: within 10%.")
    within, same, total = 0, 0, 0
    for P in Ps:
        sel = [r for r in rows if r["world_size"] == P and r["auto_us"] is not None]
        if not sel:
            continue
        colls = [c for c in C.COLLECTIVES if any(r["collective"] == c for r in sel)]
        cells = {}
        for r in sel:
            ratio = r["auto_us"] / r["best_us"] if r["best_us"] else None
            total += 1
            ok = ratio is not None and ratio <= 1.10
            noise = not ok and r["auto_resolved"] == r["best"]
            within += ok
            same += noise
            cells[(r["bytes"], r["collective"])] = (
                f"{r['auto_resolved'] or '?'} {_x(ratio)}"
                + ("" if ok else " (= best algorithm: noise)" if noise else f" ✗ (best {r['best']})"))
        sizes = sorted({b for b, _ in cells})
        doc.p(f"{P} ranks — each cell: the algorithm auto ran, its time / the best measured time "
              "(✗: more than 10% slower, and the best algorithm; '= best algorithm' where auto ran the "
              "best algorithm itself and only the measurement differs):")
        doc.table(["size"] + colls, [[C.fmt_bytes(b)] + [cells.get((b, c), "–") for c in colls] for b in sizes])
    if total:
        doc.p(f"auto within 10% of the best at {within} of {total} (collective, size, world size) points; "
              f"at {same} more it ran the best algorithm and the gap is noise between two measurements of "
              f"the same calls.")
    tun = next((d.get("tuning") for d in datas if d.get("tuning")), None)
    if tun:
        from commlib.tuning import rows_for
        trows = []
        for coll in sorted(tun.get("collectives", {})):
            for P, mb, alg in rows_for(tun, coll):
                trows.append([coll, P, "no limit" if mb < 0 else f"≤ {mb} B", alg,
                              tun["collectives"][coll][str(P)].get("source", "")])
        doc.p("Tuning table written by this run (bytes per rank, as the core's chooser sees them):")
        doc.table(["collective", "ranks", "bytes", "algorithm", "source"], trows)

    doc.h("commlib vs gloo vs MPI at each size")
    for (coll, P) in sorted({(r["collective"], r["world_size"]) for r in rows},
                            key=lambda k: (C.COLLECTIVES.index(k[0]), k[1])):
        sel = [r for r in rows if r["collective"] == coll and r["world_size"] == P]
        doc.h(f"{coll}, {P} ranks ({'in-place' if C.COMPARE_MODE[coll] == 'in' else 'out-of-place'})", 3)
        doc.table(["size", "best algorithm", "commlib µs", "auto µs", "gloo µs", "MPI µs", "gloo / commlib",
                   "MPI / commlib", "commlib busbw", "gloo busbw", "MPI busbw", "memcpy GB/s"],
                  [[C.fmt_bytes(r["bytes"]), r["best"], _us(r["best_us"]), _us(r["auto_us"]), _us(r["gloo_us"]),
                    _us(r["mpi_us"]), _x(_ratio(r["gloo_us"], r["best_us"])), _x(_ratio(r["mpi_us"], r["best_us"])),
                    _f(r["best_busbw"]), _f(r["gloo_busbw"]), _f(r["mpi_busbw"]), _f(_memcpy_at(memcpy, r["bytes"]))]
                   for r in sel])

    doc.h("Correctness")
    corr = {}
    for r in records:
        k = (r["backend"], r["collective"], r["world_size"])
        c = corr.setdefault(k, [0, 0])
        if r.get("wrong") is not None:
            c[0] += 1
            c[1] += int(r["wrong"])
    doc.table(["backend", "collective", "ranks", "results checked", "wrong values"],
              [[b, c, P, v[0], v[1]] for (b, c, P), v in sorted(corr.items())])

    sim_report.add_at_scale(doc, sims, outdir, measured=records, plt=_plt())

    doc.h("Machine and versions")
    mrows = []
    for d in datas:
        m = d.get("machine", {})
        mrows.append([d.get("world_size"), m.get("cpu"), f"{m.get('cores')} ({m.get('cores_usable')} usable)",
                      m.get("memory_gib"), m.get("os"), m.get("python"), m.get("numpy"), m.get("torch"),
                      m.get("mpi4py") or "–", _mpi_lib(d), f"{m.get('commlib')} {m.get('commlib_commit') or ''}".strip(),
                      m.get("date")])
    doc.table(["ranks", "CPU", "cores", "memory GiB", "OS", "Python", "NumPy", "torch", "mpi4py", "MPI library",
               "commlib", "date"], mrows)
    doc.p("Timing: " + (datas[0].get("timing") or "") + ".")
    cfg = datas[0].get("config", {})
    per = f"at least {cfg.get('iters')} timed calls"
    if cfg.get("min_time"):
        per += f" and about {cfg['min_time'] * 1e3:g} ms of them (at most {cfg.get('max_iters')} calls)"
    passes = cfg.get("passes", 1)
    doc.p(f"dtype {cfg.get('dtype')}, op {cfg.get('op')}, {per} after {cfg.get('warmup')} warm-up calls, "
          f"per algorithm, mode and size" + (f"; best of {passes} passes per row, every backend alike" if passes > 1
                                             else "") + ".")
    return doc


def _transport(records, P):
    for r in records:
        if r["backend"] == "commlib" and r["world_size"] == P:
            return r["transport"]
    return "shm"


def _clean(text):
    return str(text).replace("\x00", "").split(",")[0].strip()


def _mpi_lib(d):
    info = d.get("backends", {}).get("mpi", {})
    return _clean(info.get("library")) if info.get("library") else (
        "not available" if not info.get("available") else "?")


def _memcpy_at(memcpy, b):
    for m in memcpy:
        if m["bytes"] == b:
            return m["GBps"]
    return None


def generate(datas, outdir) -> str:
    """Write index.html, report.md and PNGs to ``outdir``; return the index.html path.

    Plots an earlier report left there (e.g. of world sizes this run did not measure) are removed
    first, so the directory holds exactly this report."""
    os.makedirs(outdir, exist_ok=True)
    for name in os.listdir(outdir):
        if re.fullmatch(r"(busbw|latency|model)_P\d+\.png", name):
            os.remove(os.path.join(outdir, name))
    doc = build(datas, outdir)
    with open(os.path.join(outdir, "report.md"), "w") as f:
        f.write(doc.markdown())
    path = os.path.join(outdir, "index.html")
    with open(path, "w") as f:
        f.write(doc.html("commlib benchmark report"))
    return path


def print_summary(data, out):
    """The end of a bench run: fitted parameters and commlib vs peers at every size."""
    p = lambda s="": print(s, file=out)  # noqa: E731
    p("#")
    p("# Cost model fit (per transport and world size):")
    for key, v in sorted((data.get("model") or {}).items()):
        err = v.get("rel_err_median")
        p(f"#   {key:<22} {M.describe(v)}; median |rel err| {err * 100:.0f}%" if err is not None else f"#   {key}: no data")
    mem = data.get("memcpy") or []
    if mem:
        p(f"#   memcpy (1 thread): {memcpy_largest(mem):.2f} GB/s at {C.fmt_bytes(mem[-1]['bytes'])}")
    for name, info in sorted(data.get("backends", {}).items()):
        if not info.get("available") and info.get("requested") is not False:
            p(f"#   {'MPI' if name == 'mpi' else name}: not available ({info.get('reason') or info.get('error')})")
    rows = comparison(data["results"])
    if not rows:
        return
    p("#")
    p("# commlib vs peers (median µs; ratio = peer / commlib best; compare mode per collective)")
    p(f"# {'collective':<15}{'size':>10}  {'best':<20}{'commlib':>9}{'auto':>9}{'gloo':>10}{'mpi':>9}"
      f"{'gloo/cl':>9}{'mpi/cl':>8}")
    for r in rows:
        p(f"  {r['collective']:<15}{r['bytes']:>10}  {r['best']:<20}{_us(r['best_us']):>9}{_us(r['auto_us']):>9}"
          f"{_us(r['gloo_us']):>10}{_us(r['mpi_us']):>9}{_x(_ratio(r['gloo_us'], r['best_us'])):>9}"
          f"{_x(_ratio(r['mpi_us'], r['best_us'])):>8}")


def main(args) -> int:
    datas = load(args.files)
    path = generate(datas, args.output)
    print(f"report: {path} (and {os.path.join(args.output, 'report.md')})")
    return 0
