"""``commlib report``: one self-contained HTML page and its Markdown twin from bench JSON files.

    commlib report out.json [more.json ...] -o report/

writes report/index.html (plots embedded as base64 PNG), report/report.md (same content, PNGs
linked) and the PNGs: busbw and latency vs size per algorithm (log axes, one panel per
collective, peers and memcpy overlaid), measured vs fitted model, then tables of crossover sizes,
auto's picks, commlib vs gloo vs MPI ratios at each size, fitted alpha/beta/gamma, correctness, and
the machine and versions. Every comparison is in one mode per collective (common.COMPARE_MODE: the
form every backend has) and between numbers of the same run.

The pieces: bench_files.py (schema check, loading), comparison.py (commlib vs peers per size),
report_sections.py (the sections), report_plots.py, report_doc.py (Markdown and HTML),
report_format.py (numbers in tables). This module writes the files and the summary a run prints.
"""
from __future__ import annotations

import os
import re

from commlib.perf import common as C
from commlib.perf import model as M
from commlib.bench.bench_files import RECORD_KEYS, TOP_KEYS, load, merged_records, validate  # noqa: F401
from commlib.bench.comparison import compare_records, comparison, peer_ratio  # noqa: F401
from commlib.bench.memcpy import largest as memcpy_largest
from commlib.bench.report_doc import Doc  # noqa: F401
from commlib.bench.report_format import fmt_num, fmt_ratio, fmt_us, mpi_library
from commlib.bench.report_plots import plot_metric, plot_model  # noqa: F401
from commlib.bench.report_sections import BUSBW_NOTE, build  # noqa: F401

# The names bench/results.py formats its tables with (from before the split into modules).
_us, _f, _x, _ratio, _mpi_lib = fmt_us, fmt_num, fmt_ratio, peer_ratio, mpi_library


def generate(datas, outdir, explorer=None) -> str:
    """Write index.html, report.md and PNGs to ``outdir``; return the index.html path. ``explorer``:
    the schedule explorer's page writer (report_sections.add_explorer; the ``commlib`` command hands
    it down), None for no "See the algorithms move" section.

    Plots an earlier report left there (e.g. of world sizes this run did not measure) are removed
    first, so the directory holds exactly this report."""
    os.makedirs(outdir, exist_ok=True)
    for name in os.listdir(outdir):
        if re.fullmatch(r"(busbw|latency|model)_P\d+\.png", name):
            os.remove(os.path.join(outdir, name))
    doc = build(datas, outdir, explorer)
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
        p(f"  {r['collective']:<15}{r['bytes']:>10}  {r['best']:<20}{fmt_us(r['best_us']):>9}{fmt_us(r['auto_us']):>9}"
          f"{fmt_us(r['gloo_us']):>10}{fmt_us(r['mpi_us']):>9}{fmt_ratio(peer_ratio(r['gloo_us'], r['best_us'])):>9}"
          f"{fmt_ratio(peer_ratio(r['mpi_us'], r['best_us'])):>8}")


def main(args) -> int:
    """``commlib report``: write the report of ``args.files`` to ``args.output``."""
    datas = load(args.files)
    path = generate(datas, args.output, getattr(args, "explorer", None))
    print(f"report: {path} (and {os.path.join(args.output, 'report.md')})")
    return 0
