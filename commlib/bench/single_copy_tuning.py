"""The tuning file's ``"single_copy"`` section from bench runs: per collective and world size, the
call size from which single-copy reads of a peer's buffer (process_vm_readv, one copy) measured faster
than the channels (COMMLIB_CMA=0: two copies through cache-resident chunks), and the smallest message
such a call then sends single-copy.

``commlib tune`` gets runs of both kinds (each run's config says ``single_copy``: the COMMLIB_CMA
it ran with; ``commlib bench --single-copy-ab`` times every side in one job). A side that is on is
COMMLIB_CMA=1 (messages of 64 KiB or more single-copy, the core's kSingleCopyMinMessage) or a
smallest message of its own ("32K"). At every size each side's time is its best algorithm's (auto's
rows excluded); a side's crossover is the smallest size from which it is at least as fast as the
channels at that size and every larger one (-1: it lost at the largest size, so never). Of several
sides that are on, the entry takes the one with the smallest crossover: above every side's crossover
the sides differ only in messages between their smallest ones, while the rows there differ by the
machine's noise (session 35's A/B: the 8 MiB all_to_all, 2 MiB messages, single-copy on every side,
0.61-0.77x the channels). Equal crossovers go to the least time over the sizes every side measured
(geometric mean), then to the larger smallest message. The algorithm rows
then come from the runs of the side the entry picks at each size, so auto's algorithm is the one that
was fastest under the transfer mode the call will use. A run under COMMLIB_CMA=auto (the main job)
ran each size on the side of the tuning its ranks loaded, which its config keeps
(``single_copy_in_force``): its records join the side they ran on (:func:`side_ran`); a run that
predates that record counts as the channels' (its rows below the crossover only).
"""
from __future__ import annotations

import math

from commlib.core import tuning
from commlib.perf.common import core_bytes, parse_size

NEVER = -1
DEFAULT_MIN_MESSAGE = 64 << 10  # COMMLIB_CMA=1's smallest message (csrc/policy/single_copy.h)


def min_message_of(side) -> int | None:
    """The smallest single-copy message of a run's COMMLIB_CMA: 64 KiB for "1", N for a size ("32K"),
    None for the channels ("0") and for anything that is no side ("auto": the main job's table)."""
    side = str(side or "")
    if side == "1":
        return DEFAULT_MIN_MESSAGE
    if side in ("", "0", "auto", "both"):
        return None
    try:
        n = parse_size(side)
    except ValueError:
        return None
    return n if n >= 2 else None


def is_single_copy(record) -> bool:
    """Whether a record was measured with single-copy reads on (COMMLIB_CMA=1 or a smallest message)."""
    return min_message_of(record.get("single_copy")) is not None


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


def _start(on, off, sizes):
    """The smallest size from which ``on`` is at least as fast as ``off`` at it and every larger one."""
    start = NEVER
    for b in reversed(sizes):  # from the largest down, while single-copy keeps winning
        if on[b] > off[b]:
            break
        start = b
    return start


def entries(records):
    """{(collective, P): (min call bytes or NEVER, smallest message)} where the records hold the
    channels' side and at least one side that is on."""
    # Only records measured with single-copy explicitly on or off ("0"): a run under the crossover then
    # in force ("auto", the main job) ran each size on whichever side that table said, so counting it as
    # "off" made an old crossover's single-copy rows look like the channels' (session 29: the AMD
    # table's runs on an Intel machine turned a 0.66x single-copy win into "never").
    off = _best([r for r in records if str(r.get("single_copy", "")) == "0"])
    sides = {}
    for r in records:
        m = min_message_of(r.get("single_copy"))
        if m is not None:
            sides.setdefault(m, []).append(r)
    on = {m: _best(recs) for m, recs in sides.items()}
    out = {}
    for key in sorted(off):
        measured = {m: per[key] for m, per in on.items() if key in per}
        if not measured:
            continue
        common = set(off[key])
        for per in measured.values():
            common &= set(per)
        sizes = sorted(common)
        if not sizes:
            continue
        best = None
        for m in sorted(measured, reverse=True):  # the larger smallest message first: it keeps a tie
            start = _start(measured[m], off[key], sizes)
            cost = sum(math.log(measured[m][b] if start != NEVER and b >= start else off[key][b]) for b in sizes)
            rank = (start if start != NEVER else math.inf, cost)
            if best is None or rank[0] < best[0][0] or (rank[0] == best[0][0] and cost < best[0][1] - 1e-12):
                best = (rank, start, m)
        out[key] = (best[1], best[2])
    return out


def crossovers(records):
    """{(collective, P): min call bytes or NEVER} of :func:`entries`."""
    return {key: start for key, (start, _) in entries(records).items()}


def side_ran(record, in_force):
    """The side a record of a COMMLIB_CMA=auto run ran on, as a run's COMMLIB_CMA would name it ("0":
    the channels; the smallest single-copy message's bytes, e.g. "65536"), from ``in_force``: the
    "single_copy" section its run's ranks loaded (config ``single_copy_in_force``). As the core
    decides (csrc/policy/single_copy.h single_copy_auto_min): single-copy from the entry's
    ``min_bytes`` of auto's bytes on; no entry, or -1, never."""
    coll, P = record["collective"], int(record["world_size"])
    table = {"single_copy": in_force}
    start = tuning.single_copy_crossovers(table).get(coll, {}).get(P, NEVER)
    if start < 0 or core_bytes(coll, record["bytes"], record["dtype"], P) < start:
        return "0"
    return str(tuning.single_copy_min_messages(table).get(coll, {}).get(P, DEFAULT_MIN_MESSAGE))


def choose(records, previous=None):
    """(records for the algorithm rows, the "single_copy" section). Without runs of both kinds the
    records are returned as they are and ``previous``'s section is kept."""
    section = {c: dict(per) for c, per in ((previous or {}).get("single_copy") or {}).items()}
    cross = entries(records)
    if not cross:
        return records, section
    picked = []
    for r in records:
        key = (r["collective"], r["world_size"])
        if key not in cross:
            picked.append(r)
            continue
        start, m = cross[key]
        cb = core_bytes(r["collective"], r["bytes"], r["dtype"], r["world_size"])
        on_side = start != NEVER and cb >= start
        # (a COMMLIB_CMA=auto run's record by the side it ran on, when its run says: single_copy_ran)
        side = min_message_of(r.get("single_copy_ran", r.get("single_copy")))
        if (side == m) if on_side else (side is None):
            picked.append(r)
    for (coll, P), (start, m) in cross.items():
        entry = {"min_bytes": int(start)}
        if start != NEVER and m != DEFAULT_MIN_MESSAGE:
            entry["min_message"] = int(m)
        section.setdefault(coll, {})[str(P)] = entry
    return picked, section
