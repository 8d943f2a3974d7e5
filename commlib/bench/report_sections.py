"""The report's sections, in order: summary, plots, fitted model, crossovers, auto's picks (and the
tuning table), commlib vs peers at each size, correctness, compressed collectives, "At scale" (simulator files), machine.
Every comparison is in one mode per collective and between numbers of the same run."""
from __future__ import annotations

import os

from commlib.perf import common as C
from commlib.perf import model as M
from commlib.bench.bench_files import merged_records
from commlib.bench.comparison import comparison, measured_crossovers, peer_ratio
from commlib.bench.memcpy import largest as memcpy_largest
from commlib.bench.report_compression import add_compression
from commlib.bench.report_doc import Doc
from commlib.bench.report_format import (availability, commlib_transport, fmt_num, fmt_ratio, fmt_us,
                                         memcpy_at, mpi_library)
from commlib.bench.report_plots import plot_metric, plot_model, pyplot


BUSBW_NOTE = (
    "How to read busbw: algbw is size / time. busbw multiplies it by the bytes each rank must move "
    "per byte of result for a bandwidth-optimal algorithm (all_reduce 2(P-1)/P, all_gather, "
    "reduce_scatter and all_to_all (P-1)/P, broadcast 1), so it is comparable across collectives and "
    "world sizes and against the hardware: on one host, read it against the one-thread memcpy "
    "bandwidth. Times are medians over iterations of the slowest rank's time per call; ratios "
    "compare numbers of the same run (shared machines make absolute numbers noisy, ratios less so).")


def add_explorer(doc, rows, outdir, explorer):
    """"See the algorithms move": a link to the schedule explorer for every algorithm compared at each
    world size. ``explorer(compared, outdir)``, handed down by the ``commlib`` command (bench never
    imports the explorer, which reads the simulator), writes the pages beside the report and returns
    {(collective, P, algorithm): link}; ``compared`` is {collective: {P: algorithms}}."""
    compared = {}
    for r in rows:
        compared.setdefault(r["collective"], {}).setdefault(r["world_size"], set()).update(
            a for a in r["times"] if a != "flags")  # auto's flag calls have no schedule to show
    links = explorer(compared, outdir)
    if not links:
        return
    doc.h("See the algorithms move")
    doc.p("Each link opens the schedule explorer (commlib explain: one page, no server) at an algorithm compared "
          "above: its steps as arrows between the ranks, what every rank holds after each step (the verifier) "
          "and each step's time on a modelled cluster (the simulator).")
    doc.links((f"{coll}, {P} ranks: {alg}", href) for (coll, P, alg), href in
              sorted(links.items(), key=lambda kv: (C.COLLECTIVES.index(kv[0][0]) if kv[0][0] in C.COLLECTIVES
                                                     else 99, kv[0][1], kv[0][2])))


def build(datas, outdir, explorer=None):
    """The report document (and its PNGs in ``outdir``); ``explorer``: add_explorer's page writer
    (None: no explorer section)."""
    from commlib.perf import sim_report
    sims = [d for d in datas if sim_report.is_sim(d)]
    datas = [d for d in datas if not sim_report.is_sim(d)]
    if not datas:  # predictions only
        doc = Doc()
        doc.h("commlib collective report (predictions)", 1)
        sim_report.add_at_scale(doc, sims, outdir, plt=pyplot())
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
    avail = availability(datas)
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
            head.append([coll, P, C.fmt_bytes(r["bytes"]), f"{fmt_us(r['best_us'])} ({r['best']})",
                         fmt_us(r["auto_us"]),
                         fmt_us(r["gloo_us"]), fmt_us(r["mpi_us"]), fmt_ratio(peer_ratio(r["gloo_us"], r["best_us"])),
                         fmt_ratio(peer_ratio(r["mpi_us"], r["best_us"])), fmt_num(r["best_busbw"])])
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
              [[v["backend"], v["transport"], v["world_size"], fmt_num(v["alpha"] * 1e6),
                fmt_num(v["beta"] * 1e9, ".4f"),
                fmt_num(1e-9 / v["beta"] if v["beta"] else None), fmt_num(v["gamma"] * 1e9, ".4f"),
                fmt_num(1e-9 / v["gamma"] if v["gamma"] else None), v["n"],
                fmt_num(v["rel_err_median"] * 100 if v["rel_err_median"] is not None else None, ".0f") + "%"]
               for k, v in sorted(fits.items())])

    doc.h("Crossover sizes")
    meas = measured_crossovers(rows)
    cross = []
    for (coll, P), text in sorted(meas.items(), key=lambda kv: (C.COLLECTIVES.index(kv[0][0]), kv[0][1])):
        # the model knows algorithms: auto's flag calls are none, and "<algorithm>@<variant>" (a device
        # path, or --single-copy-ab's side) is its algorithm's
        algs = sorted({a.partition("@")[0] for r in rows if r["collective"] == coll and r["world_size"] == P
                       for a in r["times"] if a != "flags"} - {"auto"})
        fit = fits.get(f"commlib/{commlib_transport(records, P)}/{P}")
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
                f"{r['auto_resolved'] or '?'} {fmt_ratio(ratio)}"
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
        from commlib.core.tuning import rows_for
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
                  [[C.fmt_bytes(r["bytes"]), r["best"], fmt_us(r["best_us"]), fmt_us(r["auto_us"]),
                    fmt_us(r["gloo_us"]), fmt_us(r["mpi_us"]), fmt_ratio(peer_ratio(r["gloo_us"], r["best_us"])),
                    fmt_ratio(peer_ratio(r["mpi_us"], r["best_us"])), fmt_num(r["best_busbw"]),
                    fmt_num(r["gloo_busbw"]), fmt_num(r["mpi_busbw"]), fmt_num(memcpy_at(memcpy, r["bytes"]))]
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

    add_compression(doc, records, outdir, plt=pyplot())
    if explorer:
        add_explorer(doc, rows, outdir, explorer)
    sim_report.add_at_scale(doc, sims, outdir, measured=records, plt=pyplot())

    doc.h("Machine and versions")
    mrows = []
    for d in datas:
        m = d.get("machine", {})
        mrows.append([d.get("world_size"), m.get("cpu"), f"{m.get('cores')} ({m.get('cores_usable')} usable)",
                      m.get("memory_gib"), m.get("os"), m.get("python"), m.get("numpy"), m.get("torch"),
                      m.get("mpi4py") or "–", mpi_library(d),
                      f"{m.get('commlib')} {m.get('commlib_commit') or ''}".strip(),
                      m.get("date")])
    doc.table(["ranks", "CPU", "cores", "memory GiB", "OS", "Python", "NumPy", "torch", "mpi4py", "MPI library",
               "commlib", "date"], mrows)
    doc.p("Timing: " + (datas[0].get("timing") or "") + ".")
    cfg = datas[0].get("config", {})
    per = f"at least {cfg.get('iters')} timed calls"
    if cfg.get("min_time"):
        per += f" and about {cfg['min_time'] * 1e3:g} ms of them (at most {cfg.get('max_iters')} calls)"
    passes = cfg.get("passes", 1)
    close = sum(1 for d in datas for r in d.get("results", []) if r.get("close_rounds"))
    doc.p(f"dtype {cfg.get('dtype')}, op {cfg.get('op')}, {per} after {cfg.get('warmup')} warm-up calls, "
          f"per algorithm, mode and size" + (f"; best of {passes} passes per row, every backend alike" if passes > 1
                                             else "") + ".")
    if cfg.get("close_rounds"):  # commlib/bench/close_calls.py
        doc.p(f"Close verdicts (auto within 10% of the best algorithm, or Open MPI against auto or commlib's "
              f"best row, turned by a 10% move of one series) got {cfg['close_rounds']} more rounds for the series deciding them: {close} "
              f"rows (their records' close_rounds).")
    return doc
