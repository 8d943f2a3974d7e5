"""Validation (b), multi-host: predicted vs measured all_reduce across emulated hosts joined by
rate-limited TCP links (network namespaces, ``commlib bench --hosts H --netns --rate R``).
Used by bench/sim_validate.py, which writes bench/RESULTS_sim.md.

The topology of these runs is built, not fitted, except for one number:

- inside a host: the 2-rank shared-memory topology fitted from the shm bench (section above);
- between hosts: one NIC per host at the tc rate, times the TCP payload share of what tbf counts;
- ``inter_latency_us``: the one fitted parameter, from the smallest sizes of the 2 x 1 run (the
  median over rows up to LATENCY_FIT_BYTES of (measured - predicted without it) / its coefficient).
The 2 x 2 run is then predicted with nothing refitted.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys

RATE = "1gbit"
RATE_GBPS = 1.0
# tbf counts whole frames on the veth (Ethernet header included, no preamble or gap): a full TCP
# segment at MTU 1500 carries 1448 payload bytes (20 IP + 20 TCP + 12 timestamp option) in 1514.
TCP_EFFICIENCY = 1448 / 1514
LATENCY_FIT_BYTES = 4096
BANDWIDTH_BOUND_BYTES = 512 << 10  # the summary splits the errors here
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


def topology(shm, devices_per_host, inter_latency_us=0.0):
    """The netns machine: the fitted shared-memory host, one rate-limited NIC per host."""
    return dataclasses.replace(
        shm, name=f"netns-{RATE}", devices_per_host=devices_per_host, nics=1, nic_Gbps=RATE_GBPS,
        nic_efficiency=TCP_EFFICIENCY, inter_latency_us=inter_latency_us,
        sources=dict(shm.sources, nic_Gbps=f"tc tbf rate {RATE} on every veth end (scripts/netns.sh)",
                     nic_efficiency="TCP payload per frame tbf counts: 1448 / 1514 at MTU 1500",
                     inter_latency_us=f"fitted: rows up to {LATENCY_FIT_BYTES} B of the 2 x 1 run"))


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


def section(lines, data_dir, shm, note, fmt_bytes):
    """Appends the multi-host TCP section; returns {run: median |error|} (empty without data)."""
    paths = [os.path.join(data_dir, name) for name, _, _ in RUNS]
    if not all(os.path.exists(p) for p in paths):
        lines += ["### Multi-host TCP, rate-limited links: no data", "",
                  f"No committed summaries ({', '.join(name for name, _, _ in RUNS)}); run the script as root with "
                  "`--measure` to make them.", ""]
        return {}
    runs = []
    for p in paths:
        with open(p) as f:
            runs.append(json.load(f))
    alpha = fit_latency(runs[0]["results"], shm)
    lines += [f"### Multi-host TCP at {RATE}/s: 2 hosts x 1 rank and 2 hosts x 2 ranks", "",
              "Emulated hosts in network namespaces joined by veth links through a bridge, every link limited by "
              f"`tc tbf` to {RATE}/s each way (scripts/netns.sh; shared memory inside a host, TCP between hosts). "
              f"{note}", ""]
    for data in runs:
        lines.append(f"- `{data.get('command', '?')}` ({data.get('machine', {}).get('date', '?')})")
    lines += ["", "Topology (bench/sim_tcp.py): inside a host, the shared-memory fit above; between hosts one NIC "
              f"per host at {RATE_GBPS:g} Gb/s x {TCP_EFFICIENCY:.3f} (TCP payload share of the frames tbf counts: "
              f"1448 of 1514 bytes); per inter-host message {alpha:.1f} us, the one number fitted here (median "
              f"over the 2 x 1 rows up to {LATENCY_FIT_BYTES} B). The 2 x 2 run is predicted with nothing "
              "refitted.", "",
              "| hosts x ranks | algorithm | size | measured (us) | predicted (us) | error |", "|---|---|---|---|---|---|"]
    summary, big, small = {}, {}, {}
    for (name, hosts, ranks), data in zip(RUNS, runs):
        topo = topology(shm, ranks // hosts, alpha)
        errs = []
        key = f"{hosts} x {ranks // hosts}"
        for r in data["results"]:
            if r["algorithm"] == "auto":
                continue
            m, q = r["time_us"]["median"], _predict(r, topo)
            errs.append(abs(q - m) / m)
            (big if r["bytes"] >= BANDWIDTH_BOUND_BYTES else small).setdefault(key, []).append(abs(q - m) / m)
            lines.append(f"| {hosts} x {ranks // hosts} | {r['algorithm']} | {fmt_bytes(r['bytes'])} | {m:.1f} | "
                         f"{q:.1f} | {(q - m) / m * 100:+.0f}% |")
        summary[f"{hosts} x {ranks // hosts}"] = statistics.median(errs) if errs else None
    med = lambda d: ", ".join(f"{k} {statistics.median(v) * 100:.0f}%" for k, v in d.items())  # noqa: E731
    lines += ["", "Median |error|: " + ", ".join(f"{k} {v * 100:.0f}%" for k, v in summary.items() if v is not None)
              + f"; from {fmt_bytes(BANDWIDTH_BOUND_BYTES)} up: {med(big)}; below: {med(small)}.", "",
              "Where it is off, and why (read from the committed run's table; not modelled):", "",
              "- From 128 KiB up the time is the tc rate's, and the predictions hold for both runs (ring within "
              "5%, the 2 x 2 run with nothing refitted); hierarchical at 8-16 MiB on 2 x 2 ran 8-13% slower than "
              "predicted (not investigated).",
              "- 8 KiB on 2 x 1: the calls moved their bytes faster than 1 Gbit/s allows (8 KiB each way "
              "in ~38 us where the rate needs ~70 us); 32 KiB and up were held to the rate. tbf passes small "
              "bursts out of its bucket; how much between back-to-back calls is not modelled, so the model "
              "charges the rate and over-predicts there.",
              "- Below 8 KiB on 2 x 1 the measured latency jumps from size to size (11-93 us, no trend): one pass "
              "pair at load ~12 from other sessions on 2 cores. The fitted 16 us per inter-host message is their "
              "median.",
              "- 2 x 2 below 32 KiB: 300-750 us measured against 29-135 us predicted. Four rank processes and their "
              "TCP progress threads share 2 cores with other sessions' jobs, so every step waits for a CPU; the "
              "model has no CPU-scheduling term and the 2-rank fit put its per-message latency at 0.", ""]
    return summary


if __name__ == "__main__":
    sys.exit("run bench/sim_validate.py")
