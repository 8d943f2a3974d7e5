"""Multi-channel rail-aligned rings (csrc/schedule/rail_ring.cc): every collective proven by the
symbolic verifier on host maps up to 64 ranks (equal hosts of 1, 2, 3, 4, 6 and 8 ranks on 1..4
hosts, 5 x 2, 7 x 3, 8 x 8, uneven, interleaved, one rank per host), in place and out of place; and the rail property:
on hosts of equal even size every local rank crosses hosts for exactly one channel, to the same
local index of the next host (with an even host count, the wrap too)."""
import random

import pytest

import commlib

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


# rail_split (csrc/schedule/side_by_side.cc): rail rings on a share of the buffer beside hierarchical
# (inter, intra, segments of its part, pieces) on the rest, share in 1/1024 (0: the default). Counts
# below the share's granularity (1, 2: one part only or one element each) included.
SPLITS = [("", "", 0, 0, 1), ("ring", "", 16, 0, 1024), ("two_shot", "ring", 8, 2, 0), ("recursive_doubling", "direct", 4, 0, 512)]


def split_schedules(hosts, count, inter, intra, segments, pieces, share):
    P = len(hosts)
    rails = count * (share or 860) // 1024
    seg = (count - rails) // segments if segments else 0
    return [_C.schedule(COLLECTIVE["all_reduce"], "rail_split", r, P, count, 0, _C.DType.float32, hosts, inter, seg,
                        intra, pieces, share) for r in range(P)]


@pytest.mark.parametrize("inter,intra,segments,pieces,share", SPLITS)
def test_rail_split_verified_on_host_maps(inter, intra, segments, pieces, share):
    """Every host map with two of the compositions (half the maps each, alternating)."""
    turn = SPLITS.index((inter, intra, segments, pieces, share)) % 2
    for k, hosts in enumerate(host_maps()):
        if k % 2 != turn:
            continue
        P = len(hosts)
        count = [0, 1, 2, P + 3, 37, 64 * P + 7][(k + len(inter)) % 6]
        _C._verify_custom(COLLECTIVE["all_reduce"], P, count,
                          split_schedules(hosts, count, inter, intra, segments, pieces, share), 0)


@pytest.mark.parametrize("H,L", [(2, 3), (3, 3), (2, 4)])
def test_rail_split_runs_its_parts_side_by_side(H, L):
    """The parts share steps: no more steps than the longer part, and steps in which a rail ring's
    message and a hierarchical one travel together, also with L even, where the L rings talk to
    every local peer in every step, so a hierarchical message goes beside a ring's to the same peer
    (ir.h: a pair's messages in one step match in op order)."""
    hosts = [h for h in range(H) for _ in range(L)]
    count = 4096 * H * L
    split = split_schedules(hosts, count, "two_shot", "", 4, 0, 860)[0]
    rails = _C.schedule(COLLECTIVE["all_reduce"], "rail_ring", 0, H * L, count * 860 // 1024, 0, _C.DType.float32, hosts)
    rest = count - count * 860 // 1024
    hier = _C.schedule(COLLECTIVE["all_reduce"], "hierarchical", 0, H * L, rest, 0, _C.DType.float32, hosts,
                       "two_shot", rest // 4)
    assert len(split["steps"]) == max(len(rails["steps"]), len(hier["steps"]))
    share = count * 860 // 1024

    def part(op):  # which share a message's buffer region lies in (scratch: neither)
        reg = op["src"] if op["op"] == "send" else op["dst"]
        return None if reg[0] == "scratch" else reg[1] >= share
    both = [st for st in split["steps"] if {part(o) for o in st if o["peer"] is not None} >= {False, True}]
    assert both, "no step carries both parts' messages"


@pytest.mark.parametrize("hosts", [[h for h in range(4) for _ in range(4)], [h for h in range(3) for _ in range(2)]],
                         ids=["4x4", "3x2"])
def test_rail_split_with_every_inter_algorithm(hosts):
    """Side by side where the hierarchical part keeps lock step, one after another where it does not
    (the trees, the power-of-two algorithms on 3 hosts): proven with every inter algorithm, 16 segments."""
    P = len(hosts)
    count = 64 * P + 7
    for inter in [""] + [a for a in commlib.algorithms("all_reduce") if a not in ("hierarchical", "rail_split", "rail_halving", "rail_lanes", "rail_window")]:
        _C._verify_custom(COLLECTIVE["all_reduce"], P, count, split_schedules(hosts, count, inter, "", 16, 0, 0), 0)


def in_lock_step(scheds):
    """Whether each pair's n-th send and n-th receive sit at the same step index on every rank."""
    sends, recvs = {}, {}
    for r, s in enumerate(scheds):
        for k, ops in enumerate(s["steps"]):
            for o in ops:
                if o["op"] == "send":
                    sends.setdefault((r, o["peer"]), []).append(k)
                elif o["op"] in ("recv", "recv_reduce"):
                    recvs.setdefault((o["peer"], r), []).append(k)
    return sends == recvs


@pytest.mark.parametrize("hosts", [[h for h in range(2) for _ in range(4)], [h for h in range(3) for _ in range(2)]],
                         ids=["2x4", "3x2"])
def test_rail_split_shares_steps_only_with_a_part_in_lock_step(hosts):
    """The lock-step whitelist (side_by_side.cc) against the built parts: wherever rail_split runs its
    hierarchical part beside the rings (fewer steps than both parts), that part's sends and receives
    sit at the same step indices on every rank (what sharing steps needs to keep a pair's order)."""
    P = len(hosts)
    count = 64 * P + 7
    rails = count * 860 // 1024
    rest = count - rails
    merged = 0
    for inter in [""] + [a for a in commlib.algorithms("all_reduce") if a not in ("hierarchical", "rail_split", "rail_halving", "rail_lanes", "rail_window")]:
        split = split_schedules(hosts, count, inter, "", 16, 0, 0)
        hier = [_C.schedule(COLLECTIVE["all_reduce"], "hierarchical", r, P, rest, 0, _C.DType.float32, hosts, inter,
                            rest // 16) for r in range(P)]
        ring = [_C.schedule(COLLECTIVE["all_reduce"], "rail_ring", r, P, rails, 0, _C.DType.float32, hosts)
                for r in range(P)]
        if len(split[0]["steps"]) < len(hier[0]["steps"]) + len(ring[0]["steps"]):
            merged += 1
            assert in_lock_step(hier), f"{inter or 'built-in'}: shares steps with a part out of lock step"
    assert merged >= 5
