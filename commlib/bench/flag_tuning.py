"""The tuning file's ``"flags"`` section from bench runs: up to which call size auto sends a
collective through the shared-memory flags (one write per rank, read by every rank) rather than the
table's algorithm (csrc/policy/flag_cutoff.h).

Auto's records at the sizes where it ran the flags (``resolved`` "flags") are the flags' times; the
named algorithms' records at the same sizes are the alternatives, each judged against the best named
algorithm of its own run and mode (tuning_picks.relative_times). Scanning up from the smallest size,
the first size where the best named algorithm beats the flags by more than FLAG_MARGIN ends the
flags: the cutoff lies halfway (geometrically) between it and the size below, as a table row's end
does (commlib/perf/tuning_path.rows); -1 when the flags lose at the smallest size. Where the flags
won at every size they ran, the entry of the table replaced is kept, if any: with a cutoff in
force, runs no longer time the flags above it, so they cannot move it up (tune from runs with the
section removed, COMMLIB_TUNING pointing at such a file, to measure the flags at every size again).
"""
from __future__ import annotations

import math

from commlib.bench import tuning_picks

# The flags lose a size only when a named algorithm beats them by more than this (relative times):
# auto's T5 tolerance is 10% per run, and a schedule near the slot's size is no steadier than the
# flags (bench/RESULTS_collectives.md: the Intel Xeon VMs' all_reduce at 8 KiB, flags 1.09x the best
# run by run, reduce_broadcast 1.03x).
FLAG_MARGIN = 0.03


def cutoffs(records, previous_section=None):
    """The ``"flags"`` section ({collective: {"P": {"max_bytes": n, "lost_at": core bytes}}}) from
    ``records`` (commlib bench records of one host), keeping ``previous_section``'s entries where these
    records show no size at which the flags lost."""
    section = {c: dict(per) for c, per in (previous_section or {}).items()}
    flags = tuning_picks.flag_sizes(records)
    rel = tuning_picks.relative_times(records)  # (the flags' against the best named of their own run)
    for (coll, P), series in sorted(tuning_picks.measured_picks(records, rel).items()):
        flagged = tuning_picks.flagged_at(flags, coll, P)
        run = [(cb, rel[(coll, P, b)]["flags"], min(t.values())) for b, cb, t in series
               if b in flagged and "flags" in rel.get((coll, P, b), {}) and t]
        lost = next((i for i, (_, flag_t, best_t) in enumerate(run) if flag_t > best_t * (1 + FLAG_MARGIN)), None)
        if lost is None:
            continue
        max_bytes = -1 if lost == 0 else int(math.sqrt(run[lost - 1][0] * run[lost][0]))
        section.setdefault(coll, {})[str(P)] = {"max_bytes": max_bytes, "lost_at": run[lost][0]}
    return {c: per for c, per in section.items() if per}


def still_flagged(flagged, series, entry):
    """The bench bytes of ``flagged`` (tuning_picks.flagged_at) that a cutoff ``entry`` (a "flags"
    section's, or None) still sends through the flags: those of core bytes <= its max_bytes."""
    if not entry:
        return set(flagged)
    return {b for b, cb, _ in series if b in flagged and cb <= entry["max_bytes"]}
