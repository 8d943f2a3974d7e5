"""Issue 24's measured acceptance: auto on real TCP links between network namespaces.

    python bench/netns_acceptance.py [--layouts 2+2,2+1+3] [--sizes 64K,1M,16M] [--passes 5]
                                     [--reps 5] [--rate 1gbit] [--topology FILE] [--append RESULTS.md]
                                     [--rails R]

Root only. For each layout ("2+1+3": three hosts holding 2, 1 and 3 consecutive ranks) it makes
one network namespace per host (commlib.testing.netns: veth links to one bridge, ``tc tbf`` at
``--rate`` on both ends of every link), starts the ranks there, and times float32 sum all_reduce
(out of place) with every registered algorithm, ``auto`` as the library ships it (no
COMMLIB_TOPOLOGY: the link-kind rule) and ``auto`` with the cost model (``--topology``, default
bench/sim_data/netns_1gbit.json, set on a sub-communicator as COMMLIB_TOPOLOGY would). All variants
run in the same processes and take turns: each pass runs every variant once (``--reps`` timed
calls after one warm-up call), the order reversed every other pass, so load moves between passes,
not between variants. A call's time is the slowest rank's; a pass's value is the median over its
calls; the table shows the median over passes (and the spread). The namespaces, veths and qdiscs
are removed on the way out, also on failure, and the script checks that none is left.

``--rails 2`` gives every host two links (scripts/netns.sh --rails, local rank i on rail i % 2) and
checks issue 39's acceptance at 16 MiB: rail_ring >= 1.8x the single-rail ring and >= 0.85x its
wire floor (2(P-1)/P x the bytes, split over the rails, at the rate x 1448/1514), e.g.
``--rails 2 --layouts 2+2,2+2+2 --sizes 16M --algorithms ring,rail_ring,hierarchical
--topology bench/sim_data/netns_1gbit_2rails.json``.

Acceptance (issue 24): on 2+2 at 1 Gbit/s, auto's hierarchical >= 1.4x flat ring at 16 MiB; on
uneven hosts, auto within 10% of the best measured algorithm at every size.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT_TOPOLOGY = os.path.join(ROOT, "bench", "sim_data", "netns_1gbit.json")
AUTO, AUTO_MODEL = "auto", "auto (cost model)"


def phases(choice: dict) -> str:
    """A hierarchical choice's inter-host algorithm, and its intra-host one after a slash."""
    return "/".join(choice[k] for k in ("inter_algorithm", "intra_algorithm") if choice.get(k))


def busy_note(load: float) -> str:
    """What the load average says about the absolute times (a quiet machine has load < 2 here)."""
    return "the machine shared with other work: absolute times are noise; " if load >= 2 else ""


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def size_name(n: int) -> str:
    for unit, name in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


def host_map(layout: str) -> list:
    """'2+1+3' -> [0, 0, 1, 2, 2, 2]."""
    counts = [int(c) for c in layout.split("+")]
    if len(counts) < 2 or min(counts) < 1:
        raise SystemExit(f"--layouts: expected ranks per host like 2+1+3 (two hosts or more), got {layout!r}")
    return [h for h, n in enumerate(counts) for _ in range(n)]


# -- the ranks' side ---------------------------------------------------------------------------------

def rank_measure(comm, algorithms, sizes, passes, reps, model):
    """Times every variant; returns {size: {variant: [[seconds per call] per pass]}} and auto's choices."""
    from commlib import _C
    mcomm = comm.split(0)  # the same ranks, with the cost model auto ranks candidates with
    mcomm._core.set_cost_model(model)
    variants = [(a, comm, a) for a in algorithms] + [(AUTO, comm, "auto"), (AUTO_MODEL, mcomm, "auto")]
    hosts = list(comm._core.host_of)
    times, choices = {}, {}
    for nbytes in sizes:
        count = nbytes // 4
        x = np.ones(count, np.float32)
        out = np.empty_like(x)
        want = float(comm.size)
        per = {label: [] for label, _, _ in variants}
        for p in range(passes):
            for label, c, algo in (variants if p % 2 == 0 else variants[::-1]):
                c.all_reduce(x, algorithm=algo, out=out)  # warm-up: plan, connections, pages
                if out[0] != want or out[-1] != want:
                    raise AssertionError(f"{label} {nbytes} B: got {out[0]}, {out[-1]}, want {want}")
                calls = []
                for _ in range(reps):
                    c.barrier()
                    t0 = time.perf_counter()
                    c.all_reduce(x, algorithm=algo, out=out)
                    calls.append(time.perf_counter() - t0)
                per[label].append(calls)
        times[nbytes] = per
        default = _C.resolve_algorithm(_C.Collective.all_reduce, "auto", count, 4, 0, comm.size, hosts, None)
        modelled = _C.resolve_algorithm(_C.Collective.all_reduce, "auto", count, 4, 0, comm.size, hosts, model)
        choices[nbytes] = {AUTO: (comm._core.auto_choice(_C.Collective.all_reduce, nbytes), default["inter_algorithm"],
                                  default["source"]),
                           AUTO_MODEL: (modelled["algorithm"], phases(modelled), modelled["source"]),
                           "predicted": {f"{k['algorithm']}({phases(k)})" if k["inter_algorithm"]
                                         else k["algorithm"]: k["predicted_s"] for k in modelled["candidates"]}}
    mcomm.close()
    return times, choices


# -- the driver's side -------------------------------------------------------------------------------

def pass_medians(per_rank_calls):
    """[rank][pass][call] -> one median per pass of the slowest rank's time per call."""
    passes = len(per_rank_calls[0])
    return [statistics.median(max(rank[p][i] for rank in per_rank_calls) for i in range(len(per_rank_calls[0][p])))
            for p in range(passes)]


def measure_layout(layout, rate, sizes, passes, reps, model, algorithms, timeout, rails=1):
    from commlib.testing.netns import Namespaces, NetnsRankPool
    import netns_acceptance as me  # the ranks import this file by module name, not as __main__
    hosts = host_map(layout)
    with Namespaces(max(hosts) + 1, rate=rate, rails=rails) as net:
        pool = NetnsRankPool(net, hosts, timeout=60)
        try:
            results = pool.run(me.rank_measure, algorithms, sizes, passes, reps, model, timeout=timeout)
        finally:
            pool.close()
        prefix = net.prefix
    left = leftovers(prefix)
    if left:
        raise SystemExit(f"netns_acceptance: left behind after {layout}: {left}")
    table = {}
    for nbytes in sizes:
        table[nbytes] = {label: pass_medians([r[0][nbytes][label] for r in results]) for label in results[0][0][nbytes]}
    return table, results[0][1]


def leftovers(prefix):
    """Namespaces, links or qdiscs with our prefix still present (netns.sh makes nothing outside its
    namespaces: the machine's own links and qdiscs are checked for names it uses too)."""
    ns = [n.split()[0] for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
          if n.startswith(prefix + "-")]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()]
    veths = [n for n in names if re.fullmatch(r"veth\d+|br\d+", n)]
    qd = [q for q in subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout.splitlines()
          if " tbf " in q]
    return ns + veths + qd


def rail_floor(layout, nbytes, rate, rails):
    """Seconds a flat ring's bytes take through one host boundary split over ``rails`` links."""
    P = len(host_map(layout))
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3}  # tc's rates are decimal
    unit = next((u for u in units if rate.endswith(u)), "")
    payload_bps = float(rate[:len(rate) - len(unit)] if unit else rate.rstrip("bit")) * units.get(unit, 1) * 1448 / 1514
    return 2 * (P - 1) / P * nbytes * 8 / rails / payload_bps


def rail_verdicts(layout, table, rate, rails):
    """Issue 39's acceptance lines: rail_ring against the single-rail ring and its wire floor."""
    out = []
    for nbytes, rows in table.items():
        if "rail_ring" not in rows or "ring" not in rows:
            continue
        med = {k: statistics.median(v) for k, v in rows.items()}
        floor = rail_floor(layout, nbytes, rate, rails)
        r = med["ring"] / med["rail_ring"]
        f = floor / med["rail_ring"]
        out.append(f"{layout}, {size_name(nbytes)}, {rails} rails: ring / rail_ring = {r:.2f}x "
                   f"({'>= 1.8x: met' if r >= 1.8 else 'MISSED (< 1.8x)'}); rail_ring at {f:.2f}x its wire floor "
                   f"{floor * 1e3:.1f} ms ({'>= 0.85x: met' if f >= 0.85 else 'MISSED (< 0.85x)'})")
    return out


def verdicts(layout, table, choices):
    """The acceptance lines for one layout."""
    out = []
    for nbytes, rows in table.items():
        med = {k: statistics.median(v) for k, v in rows.items()}
        flat = {k: v for k, v in med.items() if k not in (AUTO, AUTO_MODEL)}
        best = min(flat, key=flat.get)
        for label in (AUTO, AUTO_MODEL):
            ratio = med[label] / flat[best]
            algo, inter, _ = choices[nbytes][label]
            out.append(f"{layout}, {size_name(nbytes)}: {label} ({algo}{'/' + inter if inter else ''}) "
                       f"{med[label] * 1e3:.2f} ms = {ratio:.2f}x the best ({best}, {flat[best] * 1e3:.2f} ms): "
                       f"{'within 10%' if ratio <= 1.10 else 'MISSED (> 10%)'}")
        if layout == "2+2" and nbytes == 16 << 20:
            low = {k: min(v) for k, v in rows.items()}  # load only adds time: the best pass is the least disturbed
            for label in (AUTO, AUTO_MODEL):
                r = med["ring"] / med[label]
                out.append(f"2+2, 16 MiB: ring / {label} = {r:.2f}x medians ({'>= 1.4x: met' if r >= 1.4 else 'MISSED (< 1.4x)'}), "
                           f"{low['ring'] / low[label]:.2f}x best passes")
    return out


def markdown(layout, table, choices, passes):
    lines = [f"| {layout}: size | " + " | ".join(next(iter(table.values())).keys()) + " |",
             "| --- " * (1 + len(next(iter(table.values())))) + "|"]
    for nbytes, rows in table.items():
        cells = []
        best = min(statistics.median(v) for k, v in rows.items() if k not in (AUTO, AUTO_MODEL))
        for label, v in rows.items():
            m = statistics.median(v)
            cell = f"{m * 1e3:.2f} ({min(v) * 1e3:.1f}-{max(v) * 1e3:.1f})"
            if label in (AUTO, AUTO_MODEL):
                algo, inter, _ = choices[nbytes][label]
                cell += f" = {algo}{'/' + inter if inter else ''}"
            cells.append(f"**{cell}**" if m == best else cell)
        lines.append(f"| {size_name(nbytes)} | " + " | ".join(cells) + " |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", default="2+2,2+1+3")
    ap.add_argument("--sizes", default="64K,1M,16M")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--topology", default=DEFAULT_TOPOLOGY, help="COMMLIB_TOPOLOGY for the cost-model auto")
    ap.add_argument("--algorithms", default="", help="comma list (default: every registered all_reduce)")
    ap.add_argument("--append", default="", help="append the section to this markdown file")
    ap.add_argument("--rails", type=int, default=1, help="links per host (local rank i on rail i %% R)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("netns_acceptance: needs root (network namespaces)")
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join([here, ROOT, os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, here)
    import commlib
    from commlib import _C
    from commlib.sim import topology as sim_topology
    algorithms = a.algorithms.split(",") if a.algorithms else commlib.algorithms("all_reduce")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    start = datetime.datetime.now(datetime.timezone.utc)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    load0 = os.getloadavg()[0]
    section, lines = [], []
    for layout in a.layouts.split(","):
        P = len(host_map(layout))
        model = sim_topology.load(a.topology).engine_dict(P)
        budget = 120 + 10 * a.passes * a.reps * len(sizes) * (len(algorithms) + 2)
        table, choices = measure_layout(layout, a.rate, sizes, a.passes, a.reps, model, algorithms, budget, a.rails)
        section += markdown(layout, table, choices, a.passes) + [""]
        lines += verdicts(layout, table, choices) + (rail_verdicts(layout, table, a.rate, a.rails) if a.rails > 1 else [])
        for nbytes in sizes:
            pred = choices[nbytes]["predicted"]
            top = sorted(pred, key=pred.get)[:4]
            lines.append(f"  model's ranking {layout} {size_name(nbytes)}: " +
                         ", ".join(f"{k} {pred[k] * 1e3:.2f} ms" for k in top))
        print("\n".join(section[-len(sizes) - 3:]), flush=True)
    end = datetime.datetime.now(datetime.timezone.utc)
    head = [f"Measured {start:%Y-%m-%d %H:%M}-{end:%H:%M} UTC at {commit}, shared 2-core VM, **load average "
            f"{load0:.1f} -> {os.getloadavg()[0]:.1f}** ({busy_note(load0)}variants take turns so ratios are fairer). `python bench/netns_acceptance.py --layouts {a.layouts} "
            f"--sizes {a.sizes} --passes {a.passes} --reps {a.reps} --rate {a.rate}"
            f"{f' --rails {a.rails} --algorithms {a.algorithms}' if a.rails > 1 else ''}`. float32 sum, out of place; ms, "
            f"median over {a.passes} passes of each pass's median slowest-rank time ({a.reps} calls), range of the pass "
            f"medians in brackets; bold = the best registered algorithm. `auto` = as shipped (no COMMLIB_TOPOLOGY), "
            f"`auto (cost model)` = COMMLIB_TOPOLOGY={os.path.relpath(a.topology, ROOT)}.", ""]
    text = "\n".join(head + section + ["```"] + lines + ["```", ""])
    print(text)
    if a.append:
        with open(a.append, "a") as f:
            f.write(text)


if __name__ == "__main__":
    main()
