"""The laned algorithms' schedules again as Python algorithms, for an A/B of the host executor's lanes
in flight against list order (docs/DESIGN.md "Laned calls"): ``commlib bench --import laned_list_order``
(with ``bench/`` on PYTHONPATH) registers ``<name>_in_list_order`` for each of LANED, the very same
schedule, which the executor runs step by step in list order (schedule/lanes.h: a Python algorithm's
lane fields are not lanes), and ``<name>_merged_rounds`` for each of MERGED, the same steps merged by
rounds (schedule/subgroup.h merge_rounds: a channel's k-th step of every channel as one step of
concurrent ops, how rail_ring ran before session 27 and how it runs as a phase of hierarchical).

The schedules depend on the host map, and a Python algorithm's builder is not told it: it is taken
from LANED_AB_HOSTS (contiguous groups, as ``commlib bench --hosts`` places the ranks) or, without
it, from the rank's LOCAL_WORLD_SIZE (which ``commlib bench`` sets: WORLD_SIZE / LOCAL_WORLD_SIZE
equal hosts). Before session 28 it defaulted to one host, so an A/B run with ``--hosts 2`` and no
LANED_AB_HOSTS compared rail_ring's 4 channels (8 ranks on 2 hosts) with the one-host schedule's 2
(a ring and its reverse, twice the message size, half the steps): not the same schedule. E.g. on 8
ranks in 2 hosts::

    PYTHONPATH=bench commlib bench --np 8 --hosts 2 --peers none --import laned_list_order \\
        --algorithms rail_ring,rail_ring_in_list_order,rail_ring_merged_rounds \\
        -b 64K -e 16M -f 4 --passes 5 all_reduce
"""
import os

import commlib
from commlib import _C
from commlib.core.call_spec import COLLECTIVE

LANED = (("all_reduce", "rail_ring"), ("all_gather", "rail_ring"), ("reduce_scatter", "rail_ring"),
         ("all_reduce", "rail_split"), ("all_reduce", "rail_lanes"), ("all_reduce", "rail_window"))
# Those whose lanes run in lock step (every message's two ends at the same index of their lanes), so
# merging them by rounds keeps every message's ends in one step: rail_ring's channels.
MERGED = (("all_reduce", "rail_ring"), ("all_gather", "rail_ring"), ("reduce_scatter", "rail_ring"))


def host_count(size):
    """How many equal hosts the ranks are on: LANED_AB_HOSTS, else WORLD_SIZE / LOCAL_WORLD_SIZE."""
    if "LANED_AB_HOSTS" in os.environ:
        return max(1, int(os.environ["LANED_AB_HOSTS"]))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", size))
    if local <= 0 or size % local:
        raise ValueError(f"laned_list_order: LOCAL_WORLD_SIZE={local} does not divide {size} ranks into equal "
                         "hosts; set LANED_AB_HOSTS")
    return size // local


def hosts_of(size):
    H = host_count(size)
    return [r * H // size for r in range(size)]


def merge_rounds(steps, step_lanes):
    """schedule/subgroup.h's merge_rounds: the k-th step of every lane, in list order, as step k."""
    rounds, seen = [], {}
    for step, lane in zip(steps, step_lanes):
        k = seen.get(lane, 0)
        seen[lane] = k + 1
        if len(rounds) <= k:
            rounds.append([])
        rounds[k].extend(step)
    return [r for r in rounds if r]


def _register():
    def build(rank, size, count, root, collective, algorithm, merged):
        s = _C.schedule(COLLECTIVE[collective], algorithm, rank, size, count, root, _C.DType.float32, hosts_of(size))
        steps = merge_rounds(s["steps"], s["step_lanes"]) if merged else s["steps"]
        return {"steps": steps, "scratch_count": s["scratch_count"]}

    for collective, algorithm in LANED:
        commlib.register_algorithm(collective, f"{algorithm}_in_list_order",
                                   lambda r, n, c, root, a=(collective, algorithm): build(r, n, c, root, *a, False))
    for collective, algorithm in MERGED:
        commlib.register_algorithm(collective, f"{algorithm}_merged_rounds",
                                   lambda r, n, c, root, a=(collective, algorithm): build(r, n, c, root, *a, True))


_register()
