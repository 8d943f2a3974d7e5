"""Small messages at scale in the simulator (issue #24 item 3), a section of bench/RESULTS_sim.md.

(1) Calibration check: the dgx-h100 preset's small-message numbers come from NCCL's own tuning
    model (src/graph/tuning.cc: 3.6 us per call, 0.4 us per NVLink ring step and 0.9 us per
    network ring step with the LL protocol); the ring all_reduce of 8 B on one DGX (2(P-1) = 14
    steps) must come out at NCCL's 3.6 + 14 x 0.4 = 9.2 us.
(2) What the per-message terms change: 1 KiB all_gather and all_reduce at 2..128 hosts on eth-25g
    (one rank per host) and dgx-h100, direct against the log-step algorithms, with the presets'
    LogGP terms (send/receive overhead per message, NIC gap) and without them (the former model:
    every message costs latency and bandwidth, the overheads not serialised).

    python bench/sim_small.py  > markdown on stdout (bench/sim_validate.py puts it in RESULTS_sim.md)
"""
from __future__ import annotations

import dataclasses

from commlib import _C
from commlib.core import call_spec
from commlib.sim import topology as sim_topology


def predict(topo, ranks, coll, algo, count):
    return _C.simulate(call_spec.collective(coll), algo, count, 4, 0, topo.engine_dict(ranks))["time_s"] + topo.call_overhead_us * 1e-6


def without_loggp(topo):
    """The same preset with the per-message costs folded back into a per-op overhead that is not
    serialised (as before LogGP's o and g were modelled)."""
    return dataclasses.replace(topo, op_overhead_us=topo.op_overhead_us + topo.send_overhead_us + topo.recv_overhead_us,
                               send_overhead_us=0.0, recv_overhead_us=0.0, nic_gap_us=0.0)


def rows() -> list:
    """The section's markdown lines."""
    out = []
    h100 = sim_topology.load("dgx-h100")
    ring8 = predict(h100, 8, "all_reduce", "ring", 2)
    out += ["| check | predicted | reference | error |", "| --- | --- | --- | --- |",
            f"| dgx-h100, 1 node, ring all_reduce 8 B | {ring8 * 1e6:.2f} us | 9.20 us (NCCL tuning model, ring LL: "
            f"3.6 + 14 x 0.4) | {(ring8 / 9.2e-6 - 1) * 100:+.1f} % |", "",
            "| topology | collective 1 KiB (log-step algorithm) | hosts | direct | log-step | direct / log-step | "
            "same without o, g |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in ("eth-25g", "dgx-h100"):
        topo = sim_topology.load(name)
        old = without_loggp(topo)
        for coll, logstep in (("all_gather", "recursive_doubling"), ("all_reduce", "recursive_doubling")):
            for hosts in (2, 8, 32, 128):
                P = hosts * topo.devices_per_host
                count = max(256 // P, 1) if coll == "all_gather" else 256
                d, l = predict(topo, P, coll, "direct", count), predict(topo, P, coll, logstep, count)
                od, ol = predict(old, P, coll, "direct", count), predict(old, P, coll, logstep, count)
                out.append(f"| {name} | {coll} ({logstep}) | {hosts} | {d * 1e6:.1f} us | {l * 1e6:.1f} us | "
                           f"{d / l:.2f} | {od / ol:.2f} |")
    return out


if __name__ == "__main__":
    print("\n".join(rows()))
