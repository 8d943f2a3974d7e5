"""Hierarchical schedules composed with every registered algorithm of their collective for the
inter-host phase (CollArgs::inter_algorithm, schedule/subgroup.h): each (collective, inter
algorithm) is proven by the symbolic verifier on host maps up to 64 ranks (equal, uneven,
interleaved, one rank per host), in place and out of place; the all_reduce pipeline too; the
verifier refuses a composed schedule with a step removed; bad inter algorithms are named."""
import random

import pytest

import commlib
from commlib import _C
from commlib.core.call_spec import COLLECTIVE

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def inter_algorithms(coll):
    # One-sided algorithms cannot run a phase (tests/schedule/test_one_sided.py).
    return [a for a in commlib.algorithms(coll) if a not in ("hierarchical", "rail_split", "rail_halving", "rail_lanes", "rail_window")]


def host_maps():
    rng = random.Random(24)
    maps = [[0], [0, 1], [0, 0, 1, 1], [0, 0, 1, 2, 2, 2], [1, 0, 1, 0], [0, 1, 1, 1, 1, 2, 2],
            [2, 2, 0, 1, 1, 0, 3], [h for h in range(8) for _ in range(8)]]
    maps.append([rng.randrange(1 + 31 // 6) for _ in range(31)])
    maps.append([rng.randrange(9) for _ in range(64)])
    maps.append(list(range(16)))  # one rank per host
    return maps


def schedules(coll, hosts, count, root, inter, segment=0):
    P = len(hosts)
    return [_C.schedule(COLLECTIVE[coll], "hierarchical", r, P, count, root, _C.DType.float32, hosts, inter, segment) for r in range(P)]


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_every_inter_algorithm_verified_on_host_maps(collective):
    maps = host_maps()
    for k, inter in enumerate(inter_algorithms(collective)):
        # Pairwise selection: every inter algorithm on every map, counts and roots rotating.
        for m, hosts in enumerate(maps):
            P = len(hosts)
            counts = [0, 1, P + 3, 97]
            count = counts[(k + m) % len(counts)]
            root = (k * 7 + m) % P if collective == "broadcast" else 0
            _C._verify_custom(COLLECTIVE[collective], P, count, schedules(collective, hosts, count, root, inter), root)


@pytest.mark.parametrize("inter", inter_algorithms("all_reduce"))
def test_pipelined_all_reduce_with_each_inter_algorithm(inter):
    """Segments of 7 elements: 2 to 16 segments, the inter phase of segment t beside the intra-host
    phases of t+1 and t-1; more steps than the plain composed schedule."""
    for hosts in ([0, 0, 1, 1], [0, 0, 1, 2, 2, 2], [h % 4 for h in range(16)], [2, 2, 0, 1, 1, 0, 3]):
        P = len(hosts)
        for count in (14, 97, 1009):
            _C._verify_custom(_C.Collective.all_reduce, P, count, schedules("all_reduce", hosts, count, 0, inter, 7), 0)
        assert (len(schedules("all_reduce", hosts, 1009, 0, inter, 7)[0]["steps"]) >
                len(schedules("all_reduce", hosts, 1009, 0, inter, 0)[0]["steps"]))


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_verifier_rejects_a_broken_composed_schedule(collective):
    hosts = [0, 0, 1, 2, 2, 2]
    inter = "ring" if "ring" in inter_algorithms(collective) else inter_algorithms(collective)[0]
    for victim in range(len(hosts)):
        s = schedules(collective, hosts, 13, 0, inter)
        steps = s[victim]["steps"]
        comm = [k for k, st in enumerate(steps) if any(op["op"] != "copy" and op["op"] != "reduce" for op in st)]
        if not comm:
            continue
        del steps[comm[-1]]
        with pytest.raises(_C.VerificationError):
            _C._verify_custom(COLLECTIVE[collective], len(hosts), 13, s, 0)


def test_inter_phase_uses_the_inter_algorithm():
    """8 hosts x 2 ranks, all_reduce: with ring across hosts each rank talks to two other hosts;
    with the built-in exchange to all seven."""
    hosts = [h for h in range(8) for _ in range(2)]

    def remote_peers(inter):
        s = _C.schedule(_C.Collective.all_reduce, "hierarchical", 0, 16, 1 << 12, 0, _C.DType.float32, hosts, inter, 0)
        return {op["peer"] for st in s["steps"] for op in st if op["peer"] is not None and hosts[op["peer"]] != 0}

    assert len(remote_peers("ring")) == 2
    assert len(remote_peers("")) == 7


def test_bad_inter_algorithm_is_named():
    with pytest.raises(ValueError, match="inter_algorithm.*nope"):
        _C.schedule(_C.Collective.all_reduce, "hierarchical", 0, 4, 10, 0, _C.DType.float32, [0, 0, 1, 1], "nope")
    with pytest.raises(ValueError, match="inter_algorithm"):
        _C.schedule(_C.Collective.broadcast, "hierarchical", 0, 4, 10, 0, _C.DType.float32, [0, 0, 1, 1], "hierarchical")
