"""Multi-channel rail-aligned rings (csrc/schedule/rail_ring.cc): every collective proven by the
symbolic verifier on host maps up to 64 ranks (equal hosts of 1, 2, 3, 4, 6 and 8 ranks on 1..4
hosts, 5 x 2, 7 x 3, 8 x 8, uneven, interleaved, one rank per host), in place and out of place, with
each channel in a lane of its own (schedule/lanes.h: the verifier's lane checks, verifier_lanes.cc);
and the rail property: on hosts of equal even size every local rank crosses hosts for exactly one
channel, to the same local index of the next host (with an even host count, the wrap too)."""
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


def verify(collective, P, count, scheds):
    """The verifier's proof, the lanes' checks included (every rank's schedule names the same lanes)."""
    assert len({s["lanes"] for s in scheds}) == 1, [s["lanes"] for s in scheds]
    _C._verify_custom(COLLECTIVE[collective], P, count, scheds, 0, lanes=scheds[0]["lanes"])


def channels(hosts):
    """rail_ring's channel count on `hosts` (rail_ring.cc rail_orders): L on H >= 2 equal hosts of even
    L, else 2 (1 with at most two ranks)."""
    H, P = len(set(hosts)), len(hosts)
    sizes = {hosts.count(h) for h in set(hosts)}
    L = next(iter(sizes))
    return L if H >= 2 and len(sizes) == 1 and L % 2 == 0 else (2 if P > 2 else 1)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_each_channel_is_a_lane_listed_round_by_round(collective):
    """Channel c's steps are in lane c; the list is round by round (round k of lane 0, 1, ..., C-1,
    then round k+1), so list order runs every channel's ring step k before any channel's k+1."""
    for hosts in ([0, 0, 1, 1], [h for h in range(2) for _ in range(8)], [0] * 5, [0, 0, 1], [0, 1]):
        C = channels(hosts)
        s = schedules(collective, hosts, 1000)[1]
        assert s["lanes"] == C, (hosts, s["lanes"])
        lanes = s.get("step_lanes", [0] * len(s["steps"]))
        assert lanes == [k % C for k in range(len(lanes))], (hosts, lanes)
        assert len(lanes) % C == 0


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
        scheds = schedules(collective, hosts, count)
        verify(collective, P, count, scheds)


def first_round(s):
    """The ops of a rank's first round: every channel's first step (its lanes' first C steps)."""
    return [op for st in s["steps"][:s["lanes"]] for op in st]


def crossings(hosts, count=1 << 10):
    """For each rank, the peers of its first round's sends that live on another host."""
    local = {}
    for r, h in enumerate(hosts):
        local[r] = sum(1 for q in range(r) if hosts[q] == h)
    out = []
    for s in schedules("all_reduce", hosts, count):
        out.append([op["peer"] for op in first_round(s) if op["op"] == "send" and hosts[op["peer"]] != hosts[len(out)]])
    return out, local


@pytest.mark.parametrize("H,L", [(2, 8), (3, 8), (4, 4), (2, 2), (5, 2)])
def test_every_local_rank_crosses_for_exactly_one_channel(H, L):
    hosts = [h for h in range(H) for _ in range(L)]
    cross, local = crossings(hosts)
    steps0 = schedules("all_reduce", hosts, 1 << 10)
    for r in range(H * L):
        assert len(cross[r]) == 1, f"rank {r} crosses hosts {len(cross[r])} times in one round"
        # L channels, each sending to a different peer (L - 1 local peers and one on the next host).
        sends = [op["peer"] for op in first_round(steps0[r]) if op["op"] == "send"]
        assert len(sends) == len(set(sends)) == L
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
        verify("all_reduce", P, count, split_schedules(hosts, count, inter, intra, segments, pieces, share))


def interleaved(sched, C):
    """Whether the hierarchical part's lane (C) has a step listed before the rail rings' last one."""
    lanes = sched.get("step_lanes", [])
    hier = [k for k, lane in enumerate(lanes) if lane == C]
    rings = [k for k, lane in enumerate(lanes) if lane < C]
    return bool(hier and rings and hier[0] < rings[-1])


@pytest.mark.parametrize("H,L", [(2, 3), (3, 3), (2, 4)])
def test_rail_split_runs_its_parts_side_by_side(H, L):
    """Each part in lanes of its own (the rail rings' C channels in lanes 0..C-1, hierarchical in lane
    C: every message of a share in its part's lanes), every step of both kept, and listed round by
    round: the hierarchical part's first step right after the rings' first round, also with L even,
    where the L rings talk to every local peer in every round and hierarchical to the same peers."""
    hosts = [h for h in range(H) for _ in range(L)]
    count = 4096 * H * L
    C = channels(hosts)
    split = split_schedules(hosts, count, "two_shot", "", 4, 0, 860)[0]
    rails = _C.schedule(COLLECTIVE["all_reduce"], "rail_ring", 0, H * L, count * 860 // 1024, 0, _C.DType.float32, hosts)
    rest = count - count * 860 // 1024
    hier = _C.schedule(COLLECTIVE["all_reduce"], "hierarchical", 0, H * L, rest, 0, _C.DType.float32, hosts,
                       "two_shot", rest // 4)
    assert split["lanes"] == C + 1
    assert len(split["steps"]) == len(rails["steps"]) + len(hier["steps"])
    share = count * 860 // 1024

    def part(op):  # which share a message's buffer region lies in (scratch: neither)
        reg = op["src"] if op["op"] == "send" else op["dst"]
        return None if reg[0] == "scratch" else reg[1] >= share
    for st, lane in zip(split["steps"], split["step_lanes"]):
        assert {part(o) for o in st if o["peer"] is not None} <= {None, lane == C}, (lane, st)
    assert split["step_lanes"][C] == C, split["step_lanes"][:C + 2]
    assert interleaved(split, C)


@pytest.mark.parametrize("hosts", [[h for h in range(4) for _ in range(4)], [h for h in range(3) for _ in range(2)]],
                         ids=["4x4", "3x2"])
def test_rail_split_with_every_inter_algorithm(hosts):
    """Side by side where the hierarchical part keeps lock step, one after another where it does not
    (the trees, the power-of-two algorithms on 3 hosts): proven with every inter algorithm, 16 segments."""
    P = len(hosts)
    count = 64 * P + 7
    for inter in [""] + [a for a in commlib.algorithms("all_reduce") if a not in ("hierarchical", "rail_split", "rail_halving", "rail_lanes", "rail_window")]:
        verify("all_reduce", P, count, split_schedules(hosts, count, inter, "", 16, 0, 0))


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
    """The lock-step whitelist (side_by_side.cc) against the built parts: wherever rail_split lists its
    hierarchical part round by round beside the rings (not after them), that part's sends and
    receives sit at the same step indices on every rank (what list order needs: each round a whole
    exchange of its lane)."""
    P = len(hosts)
    count = 64 * P + 7
    rest = count - count * 860 // 1024
    merged = 0
    C = channels(hosts)
    for inter in [""] + [a for a in commlib.algorithms("all_reduce") if a not in ("hierarchical", "rail_split", "rail_halving", "rail_lanes", "rail_window")]:
        split = split_schedules(hosts, count, inter, "", 16, 0, 0)
        hier = [_C.schedule(COLLECTIVE["all_reduce"], "hierarchical", r, P, rest, 0, _C.DType.float32, hosts, inter,
                            rest // 16) for r in range(P)]
        if interleaved(split[0], C):
            merged += 1
            assert in_lock_step(hier), f"{inter or 'built-in'}: listed round by round beside a part out of lock step"
    assert merged >= 5
