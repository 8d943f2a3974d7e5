"""The explorer's data: for every (algorithm, P, count) case of one collective, every rank's real
schedule (``_C.schedule``, the registry's builders), what each rank's buffers hold after each of
its steps (``_C.verify_trace``: the verifier's symbolic contributions) and the simulator's
timeline on a topology (``_C.simulate_trace``): each step's time and the bytes each link carries.

The page carries these precomputed for a stated range of P and counts rather than computing
them in the browser from the C++ builders compiled to WebAssembly: the builders, the verifier and
the simulator are one C++ core with the host engine, so a WebAssembly build would be a second
toolchain (emscripten) and a second build of that core to keep in step; the cases a learner
steps through (P up to 16, counts of a few blocks) are small, and the data proven by the same
verifier the library runs is what the tests compare.
"""
from __future__ import annotations

import dataclasses

import commlib._C as _C
from commlib.core import call_spec
from commlib.sim.topology import Topology, load

__all__ = ["SCHEMA", "MAX_RANKS", "MAX_CASES", "hosts_for", "case", "explorer_data", "sim_summary"]

SCHEMA = "commlib-explain/1"
MAX_RANKS = 16     # the page draws every rank and every message; beyond 16 it is a tangle
MAX_CASES = 400    # a page's cases (algorithms x sizes x counts): keeps it loading in under a second
MAX_COUNT = 1 << 16  # pipelined schedules grow steps with the count


def _topology(topology, nodes):
    """(Topology, devices per host) for ``nodes`` hosts (None: the preset's devices per host)."""
    topo: Topology = load(topology)
    if nodes is not None and (not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1):
        raise ValueError(f"nodes: a host count >= 1, got {nodes!r}")
    return topo


def hosts_for(topo: Topology, P: int, nodes=None) -> list:
    """Every rank's host: filled host by host, ``ceil(P / nodes)`` ranks per host when ``nodes`` is
    given, else the topology's devices per host."""
    per_host = -(-P // nodes) if nodes else topo.devices_per_host
    return [r // per_host for r in range(P)]


def sim_summary(trace: dict, steps: int) -> dict:
    """What the page shows of ``_C.simulate_trace``: the end of each step (the last rank to finish
    it; steps counted per rank, as the schedules are), each step's time (its end minus the previous
    step's end), the step that bounds the time (the longest), and the bytes each link carries in each
    step (a transfer belongs to its sender's step) and in all."""
    ends = []
    for k in range(steps):
        done = [spans[k][1] for spans in trace["steps"] if k < len(spans)]
        ends.append(round(max(done), 12) if done else (ends[-1] if ends else 0.0))
    # Picoseconds: steps equal in the model compare equal, so the first of them bounds the time.
    step_s = [round(e - (ends[k - 1] if k else 0.0), 12) for k, e in enumerate(ends)]
    per_step = [dict() for _ in range(steps)]
    total = {}
    for src, dst, src_step, dst_step, nbytes, start, done, links in trace["transfers"]:
        for link in links:
            per_step[src_step][link] = per_step[src_step].get(link, 0) + nbytes
            total[link] = total.get(link, 0) + nbytes
    return {
        "time_s": trace["time_s"],
        "step_end_s": ends,
        "step_s": step_s,
        "bounding_step": max(range(steps), key=lambda k: step_s[k]) if steps else -1,
        "links": trace["links"],
        "link_bytes": [sorted([[l, b] for l, b in d.items()]) for d in per_step],
        "total_link_bytes": sorted([[l, b] for l, b in total.items()]),
    }


def case(collective: str, algorithm: str, P: int, count: int, topo: Topology, nodes=None, root: int = 0,
         elem_bytes: int = 4) -> dict:
    """One case of the page: schedules of every rank, the verifier's holdings, the simulator's timeline."""
    coll = call_spec.collective(collective)
    hosts = hosts_for(topo, P, nodes)
    rooted = collective in ("broadcast", "reduce", "gather", "scatter")
    root = root if rooted else 0
    scheds = [_C.schedule(coll, algorithm, r, P, count, root=root, hosts=hosts) for r in range(P)]
    trace = _C.verify_trace(coll, algorithm, P, count, root=root, hosts=hosts)
    per_host = hosts.count(0)
    engine = dataclasses.replace(topo, devices_per_host=per_host).engine_dict(P)
    sim = _C.simulate_trace(coll, algorithm, count, elem_bytes, root, engine)
    steps = max(len(s["steps"]) for s in scheds)
    return {
        "algorithm": algorithm, "resolved": scheds[0]["algorithm"], "P": P, "count": count, "root": root,
        "hosts": hosts,
        "schedules": [{"steps": s["steps"], "scratch_count": s["scratch_count"]} for s in scheds],
        "holdings": trace["holdings"],
        "sim": sim_summary(sim, steps),
    }


def _check(collective, algorithms, sizes, counts, root):
    coll = call_spec.collective(collective)
    known = list(_C.algorithms(coll))
    if not known:
        raise ValueError(f"collective: {collective!r} has no schedules to explain")
    for a in algorithms:
        if a not in known:
            raise ValueError(f"algorithm: {a!r} is not a registered {collective} algorithm "
                             f"(one of {', '.join(known)})")
    for P in sizes:
        if not isinstance(P, int) or isinstance(P, bool) or not 2 <= P <= MAX_RANKS:
            raise ValueError(f"size: the explorer draws 2..{MAX_RANKS} ranks, got {P!r}")
        if not 0 <= root < P:
            raise ValueError(f"root: {root} out of range for {P} ranks")
    for n in counts:
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_COUNT:
            raise ValueError(f"count: 1..{MAX_COUNT} elements, got {n!r}")
    if len(algorithms) * len(sizes) * len(counts) > MAX_CASES:
        raise ValueError(f"sizes x counts x algorithms: {len(algorithms) * len(sizes) * len(counts)} cases, "
                         f"more than a page carries ({MAX_CASES}); give fewer")
    return known


def explorer_data(collective: str, algorithm: str, P: int, count: int, topology="dgx-h100", nodes=None,
                  sizes=None, counts=None, algorithms=None, root: int = 0, elem_bytes: int = 4) -> dict:
    """The page's data: ``algorithm`` at ``P`` ranks and ``count`` elements first, and every case of
    ``algorithms`` (default: every registered one) x ``sizes`` (default 2..8 and P) x ``counts``
    (default count, 1 and 16 x count, up to MAX_COUNT) for the page's pickers."""
    topo = _topology(topology, nodes)
    if not isinstance(elem_bytes, int) or isinstance(elem_bytes, bool) or elem_bytes < 1:
        raise ValueError(f"elem_bytes: a byte count >= 1, got {elem_bytes!r}")
    sizes = sorted(set(sizes if sizes is not None else list(range(2, 9)) + [P]) | {P})
    counts = sorted(set(counts if counts is not None else [1, count, min(16 * count, MAX_COUNT)]) | {count})
    known = _check(collective, [algorithm] + list(algorithms or []), sizes, counts, root)
    algorithms = list(dict.fromkeys([algorithm] + list(algorithms if algorithms is not None else known)))
    many = max(len(set(hosts_for(topo, n, nodes))) for n in sizes)
    if many > 1 and not topo.nic_Gbps > 0:
        raise ValueError(f"{'nodes' if nodes else 'size'}: {many} hosts, but {topo.name} has no NICs (nic_Gbps 0) "
                         f"to join them")
    info = {i["name"]: i["summary"] for i in _C.algorithm_info(call_spec.collective(collective))}
    cases = {}
    for a in algorithms:
        for n in sizes:
            for c in counts:
                cases[f"{a}/{n}/{c}"] = case(collective, a, n, c, topo, nodes, root, elem_bytes)
    return {
        "schema": SCHEMA, "collective": collective, "topology": topo.name, "nodes": nodes,
        "elem_bytes": elem_bytes, "root": root,
        "start": {"algorithm": algorithm, "P": P, "count": count},
        "algorithms": [{"name": a, "summary": info.get(a, "")} for a in algorithms],
        "sizes": sizes, "counts": counts, "cases": cases,
    }
