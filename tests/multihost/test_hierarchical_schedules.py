"""Hierarchical schedules are proven by the symbolic verifier for host maps up to 64 ranks (even,
uneven, interleaved, one rank per host), every count shape, both buffer layouts; and the verifier
rejects a hierarchical schedule with a step removed (so these proofs can fail)."""
import random

import pytest

from commlib import _C

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def host_maps():
    rng = random.Random(13)
    maps = [[0], [0, 0], [0, 1], [0, 0, 1, 1], [0, 0, 1, 2, 2, 2], [0, 1, 2], [1, 0, 1, 0], [0, 0, 0, 1],
            [0, 1, 1, 1, 1, 2, 2], [2, 2, 0, 1, 1, 0, 3], [h for h in range(8) for _ in range(8)]]
    for P in (16, 31, 64):
        maps.append([rng.randrange(1 + P // 8) for _ in range(P)])
    maps.append(list(range(64)))  # one rank per host
    return maps


def schedules(coll, hosts, count, root):
    P = len(hosts)
    return [_C.schedule(coll, "hierarchical", r, P, count, root, "float32", hosts) for r in range(P)]


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_verified_on_host_maps(collective):
    for hosts in host_maps():
        P = len(hosts)
        for count in sorted({0, 1, P - 1, P + 3, 97}):
            for root in (sorted({0, P // 2, P - 1}) if collective == "broadcast" else [0]):
                _C._verify_custom(collective, P, count, schedules(collective, hosts, count, root), root)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_verifier_rejects_a_broken_one(collective):
    hosts = [0, 0, 1, 2, 2, 2]
    s = schedules(collective, hosts, 13, 0)
    victim = 4
    s[victim]["steps"] = s[victim]["steps"][:-1]
    with pytest.raises(_C.VerificationError):
        _C._verify_custom(collective, len(hosts), 13, s, 0)


def test_bad_host_map_is_refused():
    with pytest.raises(ValueError, match="host_of"):
        _C.schedule("all_reduce", "hierarchical", 0, 4, 10, 0, "float32", [0, 1])
