"""Rank-side checks for auto from the cost model (COMMLIB_TOPOLOGY): every rank runs the four
collectives with auto and with hierarchical (whose inter-host algorithm the model picks), checks the
results exactly (small integers), and reports what the engine chose next to what the engine's
resolution gives for the same model and host map."""
from __future__ import annotations

import numpy as np

from commlib import _C, settings, tuning
from commlib.sim import topology as sim_topology

import multihost_cases
from commlib.core.call_spec import COLLECTIVE

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
COUNTS = (1, 4099, 70_001)


def run(comm):
    """{(collective, count): (auto's choice, the model's choice, the hierarchical inter algorithm)}
    and the failures."""
    # The pool's processes installed this machine's tuning table when they imported commlib; the
    # table would win over the model where it has the shape (policy/auto_policy.h).
    _C.clear_tuning()
    try:
        return _run(comm)
    finally:
        tuning.load_default()


def _run(comm):
    model = sim_topology.load(settings.get("COMMLIB_TOPOLOGY")).engine_dict(comm.size)
    hosts = list(comm._core.host_of)
    seen, failures = {}, []
    for coll in COLLECTIVES:
        for count in COUNTS:
            for algo in ("auto", "hierarchical"):
                root = count % comm.size if coll == "broadcast" else 0
                err = multihost_cases._one(comm, coll, algo, count, np.int32, root)
                if err:
                    failures.append(f"{coll} {algo} count {count}: {err}")
            want = _C.resolve_algorithm(COLLECTIVE[coll], "auto", count, 4, 0, comm.size, hosts, model)
            hier = _C.resolve_algorithm(COLLECTIVE[coll], "hierarchical", count, 4, 0, comm.size, hosts, model)
            seen[f"{coll}:{count}"] = (comm._core.auto_choice(COLLECTIVE[coll], count * 4, 4), want["algorithm"], want["source"],
                                       hier["inter_algorithm"])
    return seen, failures
