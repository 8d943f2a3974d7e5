"""Multi-channel rail-aligned rings (csrc/schedule/rail_ring.cc): every collective proven by the
symbolic verifier on host maps up to 64 ranks (equal hosts of 1, 2, 3, 4, 6 and 8 ranks on 1..4
hosts, 5 x 2, 7 x 3, 8 x 8, uneven, interleaved, one rank per host), in place and out of place; and the rail property:
on hosts of equal even size every local rank crosses hosts for exactly one channel, to the same
local index of the next host (with an even host count, the wrap too)."""
import random

import pytest

from commlib import _C
from commlib.core.call_spec import COLLECTIVE

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def schedules(coll, hosts, count):
    P = len(hosts)
    return [_C.schedule(COLLECTIVE[coll], "rail_ring", r, P, count, 0, _C.DType.float32, hosts, "", 0, "")
            for r in range(P)]


def host_maps():
    rng = random.Random(39)
    equal = [[h for h in range(H) for _ in range(L)] for H in (1, 2, 3, 4) for L in (1, 2, 3, 4, 6, 8)]
    return equal + [[h for h in range(5) for _ in range(2)], [h for h in range(7) for _ in range(3)], [0, 0, 1, 2, 2, 2], [1, 0, 1, 0, 2], [2, 2, 0, 1, 1, 0, 3], [rng.randrange(9) for _ in range(64)],
                    [h for h in range(8) for _ in range(8)]]


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_rail_ring_verified_on_host_maps(collective):
    for k, hosts in enumerate(host_maps()):
        P = len(hosts)
        count = [0, 1, P + 3, 37][k % 4]
        _C._verify_custom(COLLECTIVE[collective], P, count, schedules(collective, hosts, count), 0)


def crossings(hosts, count=1 << 10):
    """For each rank, the peers of its first step's sends that live on another host."""
    local = {}
    for r, h in enumerate(hosts):
        local[r] = sum(1 for q in range(r) if hosts[q] == h)
    out = []
    for s in schedules("all_reduce", hosts, count):
        out.append([op["peer"] for op in s["steps"][0] if op["op"] == "send" and hosts[op["peer"]] != hosts[len(out)]])
    return out, local


@pytest.mark.parametrize("H,L", [(2, 8), (3, 8), (4, 4), (2, 2), (5, 2)])
def test_every_local_rank_crosses_for_exactly_one_channel(H, L):
    hosts = [h for h in range(H) for _ in range(L)]
    cross, local = crossings(hosts)
    steps0 = schedules("all_reduce", hosts, 1 << 10)
    for r in range(H * L):
        assert len(cross[r]) == 1, f"rank {r} crosses hosts {len(cross[r])} times in one step"
        # L channels, each sending to a different peer (L - 1 local peers and one on the next host).
        assert sum(op["op"] == "send" for op in steps0[r]["steps"][0]) == L
        q = cross[r][0]
        assert hosts[q] == (hosts[r] + 1) % H
        if H % 2 == 0 or hosts[r] != H - 1:  # rail-aligned (odd H: all but the wrap)
            assert local[q] == local[r], f"rank {r} (local {local[r]}) crosses to local {local[q]}"
