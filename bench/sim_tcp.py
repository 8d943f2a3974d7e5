"""Validation (b), multi-host: predicted vs measured all_reduce across emulated hosts joined by
rate-limited TCP links (network namespaces, ``commlib bench --hosts H --netns --rate R``).
Used by bench/sim_validate.py, which writes bench/RESULTS_sim.md.

The topology of these runs is built, not fitted, except for one number:

- inside a host: the 2-rank shared-memory topology fitted from the shm bench (section above);
- between hosts: one NIC per host at the tc rate, times the TCP payload share of what tbf counts;
- ``inter_latency_us``: fitted from the smallest sizes of the 2 x 1 run (the median over rows up
  to LATENCY_FIT_BYTES of (measured - predicted without it) / its coefficient);
- CPU scheduling (docs/simulator.md, "Waiting"): the emulated hosts share this machine's cores,
  ``cores_per_host`` = cores / hosts (2 / 2 = 1: the 2 x 2 run has 2 ranks per core); receivers
  on shared memory spin ``spin_us`` = 20 us (COMMLIB_SPIN_US's default) before sleeping, receivers of
  another host's message poll their sockets ``inter_spin_us`` = 1000 us (COMMLIB_TCP_SPIN_US's
  default), offering the core between polls (csrc/transport/tcp/tcp_spin.cc), so within it they pay no
  wake-up even with two ranks per core;
  ``sched_quantum_us``, the wait of a woken rank for a core, is fitted on the 2 x 2 ring rows up to
  LATENCY_FIT_BYTES (commlib.sim.fit_sched), the hierarchical rows being out of sample. The
  wake-up itself (``wake_us``) is not separable from it at one oversubscription ratio and stays 0:
  the fitted quantum includes it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sim_inputs import require  # noqa: E402

RATE = "1gbit"
RATE_GBPS = 1.0
# tbf counts whole frames on the veth (Ethernet header included, no preamble or gap): a full TCP
# segment at MTU 1500 carries 1448 payload bytes (20 IP + 20 TCP + 12 timestamp option) in 1514.
TCP_EFFICIENCY = 1448 / 1514
LATENCY_FIT_BYTES = 4096
BANDWIDTH_BOUND_BYTES = 512 << 10  # the summary splits the errors here
from commlib.sim.fit_sched import SPIN_US, TCP_SPIN_US  # noqa: E402  COMMLIB_SPIN_US's, COMMLIB_TCP_SPIN_US's defaults
RUNS = (("tcp_1gbit_h2x1.json", 2, 2), ("tcp_1gbit_h2x2.json", 2, 4))  # (summary, hosts, ranks)
BENCH = ["all_reduce", "--algorithms", "ring,hierarchical", "-b", "8", "-e", "16M", "-f", "4", "--peers", "none",
         "--passes", "2", "--mode", "out", "--netns", "--rate", RATE]


def measure(root, data_dir, run_bench, summarize, tmp):
    """Runs the netns benches (root only) and rewrites their summaries; returns a note."""
    if os.geteuid() != 0:
        return ("The netns measurement was skipped (not root: network namespaces need CAP_NET_ADMIN); the "
                "committed summaries were used.")
    helptext = subprocess.run([sys.executable, "-m", "commlib", "bench", "--help"], cwd=root, capture_output=True,
                              text=True).stdout
    if "--netns" not in helptext:
        return "The netns measurement was skipped (this tree's `commlib bench` has no --netns); the committed summaries were used."
    for name, hosts, ranks in RUNS:
        raw = os.path.join(tmp, name)
        run_bench(raw, BENCH + ["--hosts", str(hosts), "--np", str(ranks)])
        summarize(raw, os.path.join(data_dir, name))
    return "Measured in this run of the script."


def topology(shm, devices_per_host, inter_latency_us=0.0, cores_per_host=0, sched_quantum_us=0.0):
    """The netns machine: the fitted shared-memory host, one rate-limited NIC per host; with
    ``cores_per_host`` > 0, the CPU-scheduling terms (module docstring)."""
    sched = dict(cores_per_host=0, spin_us=0.0, wake_us=0.0, sched_quantum_us=0.0) if cores_per_host <= 0 else dict(
        cores_per_host=cores_per_host, spin_us=SPIN_US, inter_spin_us=TCP_SPIN_US, wake_us=0.0,
        sched_quantum_us=sched_quantum_us)
    return dataclasses.replace(
        shm, name=f"netns-{RATE}", devices_per_host=devices_per_host, nics=1, nic_Gbps=RATE_GBPS,
        nic_efficiency=TCP_EFFICIENCY, inter_latency_us=inter_latency_us, **sched,
        sources=dict(shm.sources, nic_Gbps=f"tc tbf rate {RATE} on every veth end (scripts/netns.sh)",
                     nic_efficiency="TCP payload per frame tbf counts: 1448 / 1514 at MTU 1500",
                     inter_latency_us=f"fitted: rows up to {LATENCY_FIT_BYTES} B of the 2 x 1 run",
                     cores_per_host="this machine's cores / emulated hosts (the hosts share them)",
                     spin_us="COMMLIB_SPIN_US's default: a shared-memory wait's spin before sleeping",
                     inter_spin_us="COMMLIB_TCP_SPIN_US's default: a TCP wait polls the sockets this long, "
                                   "sched_yield between polls (csrc/transport/tcp/tcp_spin.cc)",
                     sched_quantum_us=f"fitted: ring rows up to {LATENCY_FIT_BYTES} B of the 2 x 2 run; includes "
                                      "the wake-up (wake_us 0: not separable at one oversubscription ratio)"))


def fit_quantum(rows, shm, devices_per_host, alpha, cores_per_host):
    """sched_quantum_us from the ring rows up to LATENCY_FIT_BYTES of an oversubscribed run."""
    from commlib.sim.fit_sched import fit_monotone
    ring = [r for r in rows if r["algorithm"] == "ring"]
    return fit_monotone(ring, lambda v: topology(shm, devices_per_host, alpha, cores_per_host, v),
                        max_bytes=LATENCY_FIT_BYTES)


def _predict(r, topo):
    from commlib import sim
    return sim.predict(r["collective"], r["algorithm"], r["bytes"], r["world_size"], topo, r["dtype"])["time_us"]["median"]


def fit_latency(rows, shm):
    """inter_latency_us from the small rows: the simulator is linear in it (bench/sim_tcp.py)."""
    t0, t1 = topology(shm, 1, 0.0), topology(shm, 1, 1.0)
    est = []
    for r in rows:
        if r["bytes"] > LATENCY_FIT_BYTES or r["algorithm"] == "auto":
            continue
        base, slope = _predict(r, t0), _predict(r, t1) - _predict(r, t0)
        if slope > 0:
            est.append((r["time_us"]["median"] - base) / slope)
    if not est:
        raise ValueError("no rows to fit the inter-host latency on")
    return max(0.0, statistics.median(est))


def _band(nbytes):
    return "small" if nbytes < 32 << 10 else ("mid" if nbytes < BANDWIDTH_BOUND_BYTES else "big")


BANDS = (("small", "< 32 KiB"), ("mid", "32-256 KiB"), ("big", ">= 512 KiB"))


def section(lines, data_dir, shm, note, fmt_bytes):
    """Appends the multi-host TCP section; returns {run: median |error| with the scheduling terms}.
    SystemExit naming the first missing summary."""
    paths = [require(os.path.join(data_dir, name), "run bench/sim_validate.py --measure as root (netns benches)")
             for name, _, _ in RUNS]
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    alpha = fit_latency(runs[0]["results"], shm)
    cores = {name: max(1, int(data.get("machine", {}).get("cores") or 1) // hosts)
             for (name, hosts, _), data in zip(RUNS, runs)}
    over_name, over_hosts, over_ranks = RUNS[1]
    quantum = fit_quantum(runs[1]["results"], shm, over_ranks // over_hosts, alpha, cores[over_name])
    lines += [f"### Multi-host TCP at {RATE}/s: 2 hosts x 1 rank and 2 hosts x 2 ranks", "",
              "Emulated hosts in network namespaces joined by veth links through a bridge, every link limited by "
              f"`tc tbf` to {RATE}/s each way (scripts/netns.sh; shared memory inside a host, TCP between hosts). "
              f"{note}", ""]
    for data in runs:
        lines.append(f"- `{data.get('command', '?')}` ({data.get('machine', {}).get('date', '?')})")
    lines += ["", "Topology (bench/sim_tcp.py): inside a host, the shared-memory fit above; between hosts one NIC "
              f"per host at {RATE_GBPS:g} Gb/s x {TCP_EFFICIENCY:.3f} (TCP payload share of the frames tbf counts: "
              f"1448 of 1514 bytes); per inter-host message {alpha:.1f} us (median over the 2 x 1 rows up to "
              f"{LATENCY_FIT_BYTES} B). Two models of the same runs:", "",
              "- **before**: no CPU scheduling (every rank a core of its own, never asleep);",
              f"- **after** (docs/simulator.md, \"Waiting\"): the emulated hosts share this machine's "
              f"{int(runs[1].get('machine', {}).get('cores') or 0)} cores, `cores_per_host` = cores / hosts = "
              f"{cores[over_name]}, so the 2 x 2 run has {over_ranks // over_hosts} ranks per core and every receive "
              f"there waits for its core: `sched_quantum_us` = {quantum:.1f} us, fitted on the 2 x 2 **ring** rows up "
              f"to {LATENCY_FIT_BYTES} B (the hierarchical rows are out of sample; the wake-up is inside this number, "
              f"`wake_us` 0: one oversubscription ratio cannot separate them); receivers on shared memory spin "
              f"`spin_us` = {SPIN_US:g} us (COMMLIB_SPIN_US's default) before sleeping, receivers of another host's "
              f"message poll `inter_spin_us` = {TCP_SPIN_US:g} us (COMMLIB_TCP_SPIN_US's default), offering the core "
              "between polls. With `wake_us` 0 the spins change no prediction here. The summaries were measured "
              "before the TCP wait yielded (a 20 us spin without yielding): rerun `--measure` for the current wait. "
              "The 2 x 1 run (one rank per core) is unchanged by these terms: its messages arrive within the spin.", "",
              "| hosts x ranks | algorithm | size | measured (us) | before (us) | error | after (us) | error |",
              "|---|---|---|---|---|---|---|---|"]
    summary, errs = {}, {}
    for (name, hosts, ranks), data in zip(RUNS, runs):
        before = topology(shm, ranks // hosts, alpha)
        after = topology(shm, ranks // hosts, alpha, cores[name], quantum)
        key = f"{hosts} x {ranks // hosts}"
        for r in data["results"]:
            if r["algorithm"] == "auto":
                continue
            m, q0, q1 = r["time_us"]["median"], _predict(r, before), _predict(r, after)
            e0, e1 = (q0 - m) / m, (q1 - m) / m
            for band in (_band(r["bytes"]), "all"):
                errs.setdefault((key, band), []).append((abs(e0), abs(e1)))
            lines.append(f"| {key} | {r['algorithm']} | {fmt_bytes(r['bytes'])} | {m:.1f} | {q0:.1f} | "
                         f"{e0 * 100:+.0f}% | {q1:.1f} | {e1 * 100:+.0f}% |")
        summary[key] = statistics.median(e for _, e in errs[(key, "all")])

    def cell(key, band):
        if (key, band) not in errs:
            return "-"
        return " -> ".join(f"{statistics.median(e[i] for e in errs[(key, band)]) * 100:.0f}%" for i in (0, 1))

    lines += ["", "Median |error| by size band (before -> after):", "",
              "| hosts x ranks | " + " | ".join(label for _, label in BANDS) + " | all |",
              "|---|" + "---|" * (len(BANDS) + 1)]
    for key in summary:
        lines.append(f"| {key} | " + " | ".join(cell(key, b) for b, _ in BANDS) + f" | {cell(key, 'all')} |")
    lines += ["", "Where it is off, and why (read from the committed run's table):", "",
              "- From 128 KiB up the time is the tc rate's, and the predictions hold for both runs (ring within "
              "5%); hierarchical at 8-16 MiB on 2 x 2 ran 12-17% slower than predicted before and 4-9% after "
              "(its intra-host steps move their bytes with a shared core).",
              "- 2 x 2 below 32 KiB: before, 300-750 us measured against 29-135 us predicted (the model had no "
              "CPU term); after, every step's receive waits for a core and the small rows come within about 20% "
              "for ring (fitted) and hierarchical (out of sample). One quantum per receive is the model's "
              "average: the measured per-step cost also carries the other sessions' load on the 2 cores.",
              "- 2 x 2 hierarchical at 32-128 KiB is over-predicted after: the model charges the wait for a core "
              "to every receive of an oversubscribed host, the intra-host steps around the long inter-host "
              "transfer included, whereas the measured 32 KiB call (340 us) is about the 8 B one plus the "
              "transfer, as if those waits overlapped it; which ranks are runnable is not tracked.",
              "- 8 KiB on 2 x 1: the calls moved their bytes faster than 1 Gbit/s allows (8 KiB each way "
              "in ~38 us where the rate needs ~70 us); 32 KiB and up were held to the rate. tbf passes small "
              "bursts out of its bucket; how much between back-to-back calls is not modelled, so the model "
              "charges the rate and over-predicts there.",
              "- Below 8 KiB on 2 x 1 the measured latency jumps from size to size (11-93 us, no trend): one pass "
              "pair at load ~12 from other sessions on 2 cores. The fitted per inter-host message latency is their "
              "median; it is inside the spin, so no wake-up is charged.", ""]
    return summary


if __name__ == "__main__":
    sys.exit("run bench/sim_validate.py")
