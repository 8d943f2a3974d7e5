"""The tuning file's ``"single_copy"`` section from bench runs: per collective and world size, the
call size from which single-copy reads of a peer's buffer (COMMLIB_CMA=1: process_vm_readv, one
copy) measured faster than the channels (COMMLIB_CMA=0: two copies through cache-resident chunks).

``commlib tune`` gets runs of both kinds (each run's config says ``single_copy``: the COMMLIB_CMA
it ran with). At every size both measured, each side's time is its best algorithm's (auto's rows
excluded); the crossover is the smallest size from which single-copy is at least as fast at that
size and every larger one (-1: it lost at the largest size, so never). The algorithm rows then come
from the runs of the side the crossover picks at each size, so auto's algorithm is the one that was
fastest under the transfer mode the call will use.
"""
from __future__ import annotations

from commlib.perf.common import core_bytes

NEVER = -1


def is_single_copy(record) -> bool:
    """Whether a record was measured with every large message single-copy (COMMLIB_CMA=1)."""
    return str(record.get("single_copy", "")) == "1"


def _best(records):
    """{(collective, P): {core bytes: best seconds over algorithms}} of commlib's non-auto records."""
    out = {}
    for r in records:
        if r["backend"] != "commlib" or r["algorithm"] == "auto" or r.get("wrong"):
            continue
        cb = core_bytes(r["collective"], r["bytes"], r["dtype"], r["world_size"])
        per = out.setdefault((r["collective"], r["world_size"]), {})
        t = r["time_us"]["median"] * 1e-6
        per[cb] = min(per.get(cb, t), t)
    return out


def crossovers(records):
    """{(collective, P): min call bytes or NEVER} where the records hold both kinds of run."""
    # Only records measured with single-copy explicitly on ("1") or off ("0"): a run under the
    # crossover then in force ("auto", the main job) ran each size on whichever side that table said,
    # so counting it as "off" made an old crossover's single-copy rows look like the channels' (session
    # 29: the AMD table's runs on an Intel machine turned a 0.66x single-copy win into "never").
    on = _best([r for r in records if str(r.get("single_copy", "")) == "1"])
    off = _best([r for r in records if str(r.get("single_copy", "")) == "0"])
    out = {}
    for key in sorted(set(on) & set(off)):
        sizes = sorted(set(on[key]) & set(off[key]))
        if not sizes:
            continue
        start = NEVER
        for b in reversed(sizes):  # from the largest down, while single-copy keeps winning
            if on[key][b] > off[key][b]:
                break
            start = b
        out[key] = start
    return out


def choose(records, previous=None):
    """(records for the algorithm rows, the "single_copy" section). Without runs of both kinds the
    records are returned as they are and ``previous``'s section is kept."""
    section = {c: dict(per) for c, per in ((previous or {}).get("single_copy") or {}).items()}
    cross = crossovers(records)
    if not cross:
        return records, section
    picked = []
    for r in records:
        key = (r["collective"], r["world_size"])
        if key not in cross:
            picked.append(r)
            continue
        start = cross[key]
        cb = core_bytes(r["collective"], r["bytes"], r["dtype"], r["world_size"])
        on_side = start != NEVER and cb >= start
        if is_single_copy(r) == on_side:
            picked.append(r)
    for (coll, P), start in cross.items():
        section.setdefault(coll, {})[str(P)] = {"min_bytes": int(start)}
    return picked, section
