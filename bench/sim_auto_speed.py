"""How long auto's cost model takes to choose at thousands of ranks (issue 24: "4096 ranks still
predicted in under a minute"), with the branch-and-bound search (policy/candidate_search.h) and,
with --before, with the full ranking it replaced (every candidate simulated to the end:
predict_candidates, what resolve_algorithm did before).

    python bench/sim_auto_speed.py [--ranks 4096] [--topology dgx-h100] [--sizes 1K,1M,1G]
                                   [--collectives all_reduce,all_gather,reduce_scatter,broadcast] [--before] [--exact]

Per call shape: wall and CPU seconds of one resolution in this process (cache cleared first), the
candidates simulated out of all, how many of those were cut short, how many were estimated from
their first segments (and of those simulated whole), and the choice. With --before also the full
ranking's wall time and its argmin, with --exact the search without estimates (every candidate
it keeps simulated whole): both must equal the search's choice.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from commlib.sim import ranking  # noqa: E402
from commlib import _C  # noqa: E402
from commlib.core import call_spec  # noqa: E402
from commlib.sim import topology as sim_topology  # noqa: E402


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def label(d) -> str:
    return "/".join([d["algorithm"]] + [d[k] for k in ("inter_algorithm", "intra_algorithm") if d.get(k)])


def count_for(coll: str, nbytes: int, ranks: int) -> int:
    """ir.h's count from nccl-tests' size (per-rank block for all_gather / reduce_scatter)."""
    per = nbytes // 4
    return max(1, per // ranks) if coll in ("all_gather", "reduce_scatter") else per


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--topology", default="dgx-h100")
    ap.add_argument("--sizes", default="1K,1M,1G")
    ap.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter,broadcast")
    ap.add_argument("--before", action="store_true", help="also time the full ranking (minutes at 4096 ranks)")
    ap.add_argument("--exact", action="store_true",
                    help="also time the search without extrapolation (every candidate it keeps simulated whole)")
    a = ap.parse_args(argv)
    _C.clear_tuning()  # this machine's table describes this machine, not the simulated cluster
    d = sim_topology.load(a.topology).engine_dict(a.ranks)
    hosts = len(set(d["host_of"]))
    print(f"{a.ranks} ranks on {hosts} {a.topology} hosts; load average {os.getloadavg()[0]:.1f}")
    print("| collective | size | auto's choice | search wall / CPU (s) | simulated / candidates (cut) "
          "| extrapolated (confirmed) |"
          + (" full ranking wall / CPU (s) | full argmin |" if a.before else "")
          + (" exact search wall / CPU (s) | its choice |" if a.exact else ""))
    print("| --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if a.before else "") + (" --- | --- |" if a.exact else ""))
    worst, mismatches = 0.0, 0
    for coll in a.collectives.split(","):
        ce = call_spec.collective(coll, "--collectives")
        for s in a.sizes.split(","):
            nbytes = parse_size(s)
            count = count_for(coll, nbytes, a.ranks)
            _C.clear_candidate_cache()
            t0, c0 = time.perf_counter(), time.process_time()
            r = _C.search_candidates(ce, count, 4, 0, d)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            worst = max(worst, wall)
            row = (f"| {coll} | {s} | {label(r)} | {wall:.1f} / {cpu:.1f} | {r['simulated']} / {r['candidates']} "
                   f"({r['cut']}) | {r['extrapolated']} ({r['confirmed']}) |")
            if a.before:
                t0, c0 = time.perf_counter(), time.process_time()
                cands = _C.predict_candidates(ce, count, 4, 0, d)
                full = f"{time.perf_counter() - t0:.1f} / {time.process_time() - c0:.1f}"
                best = ranking.tie_pick(cands)  # the tie rule: the first listed within the tie
                mismatches += label(best) != label(r)
                row += f" {full} | {label(best)} |"
            if a.exact:
                _C.clear_candidate_cache()
                t0, c0 = time.perf_counter(), time.process_time()
                e = _C.search_candidates(ce, count, 4, 0, d, extrapolate_ops=0)
                mismatches += label(e) != label(r)
                row += f" {time.perf_counter() - t0:.1f} / {time.process_time() - c0:.1f} | {label(e)} |"
            print(row, flush=True)
    print(f"slowest resolution: {worst:.1f} s" + (f"; choices differing from the full ranking / exact search: {mismatches}"
                                                   if a.before or a.exact else ""))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
