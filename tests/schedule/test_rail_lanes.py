"""rail_lanes all_reduce (csrc/schedule/rail_lanes.cc): rail_halving in W lanes (schedule/lanes.h),
proven by the verifier (in place and out of place) on the host maps where the lanes run (equal
power-of-two hosts, 4 to 64 ranks) and where it is rail_halving in one lane (one host, odd and
uneven hosts, interleaved host ids, one rank per host, fewer elements than lanes), with awkward
counts (0, 1, fewer than the ranks, primes) and 1 to 16 segments a lane; the lane checks
(verify/verifier_lanes.cc) catch a message that crosses lanes, lanes that share an element, and
lanes of unequal length (schedules given without step_lanes: lane c the c-th W-th of the steps)."""
import copy

import pytest

from commlib import _C

PAIRED = [[h for h in range(H) for _ in range(L)] for H, L in ((2, 2), (2, 4), (4, 2), (4, 4), (2, 8), (8, 8))]
ONE_LANE = [[0] * 4, [h for h in range(3) for _ in range(3)], [0, 0, 1, 2, 2, 2], [1, 0, 1, 0, 2, 2], [0, 1, 2, 3]]


def schedules(hosts, count, segment, lanes, ramp=0):
    P = len(hosts)
    return [_C.schedule(_C.Collective.all_reduce, "rail_lanes", r, P, count, 0, _C.DType.float32, hosts, "",
                        segment, "", lanes, ramp) for r in range(P)]


def verify(hosts, count, scheds):
    _C._verify_custom(_C.Collective.all_reduce, len(hosts), count, scheds, 0, lanes=scheds[0]["lanes"])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("hosts", PAIRED + ONE_LANE, ids=lambda h: "x".join(map(str, [len(set(h)), len(h)])))
def test_verified_on_host_maps(hosts):
    P = len(hosts)
    paired = hosts in PAIRED
    # (count, segment, lanes): empty, one element, fewer than the ranks, primes over 2 to 16
    # segments a lane, 3 and 8 lanes of several elements a block.
    cases = [(0, 0, 2), (1, 1, 2), (max(1, P - 1), 1, 4), (97, 49, 2), (97, 6, 4), (P * 8 * 4 + 3, P * 8, 3),
             (P * 8 * 8 + 5, P * 4, 8)]
    if P == 64:
        cases = [(1, 1, 2), (97, 7, 4), (64 * 16 + 5, 64 * 2, 2)]  # the verifier's time grows with P x steps
    for count, segment, lanes in cases:
        scheds = schedules(hosts, count, segment, lanes)
        want = lanes if paired and count >= lanes else 1
        assert all(s["lanes"] == want for s in scheds), (count, lanes, scheds[0]["lanes"])
        verify(hosts, count, scheds)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("hosts", PAIRED + ONE_LANE[:2], ids=lambda h: "x".join(map(str, [len(set(h)), len(h)])))
def test_ramped_segments_verified(hosts):
    """Ramped segments (share = the ramp, hierarchical_layout.h Layout): each lane's first and last
    segment cut in halves (1) or quarters and a half (2), with awkward counts where the ramp applies
    (a ramp piece of at least a block per rank) and where it falls back to equal segments."""
    P = len(hosts)
    cases = [(1, 1, 2, 1), (97, 6, 4, 1), (P * 8 * 4 + 3, P * 8, 3, 1), (P * 8 * 8 + 5, P * 4, 2, 2),
             (P * 16 * 4 + 7, P * 4 * 4, 4, 3)]
    if P == 64:
        cases = [(97, 7, 4, 1), (64 * 16 + 5, 64 * 4, 2, 1)]
    for count, segment, lanes, ramp in cases:
        verify(hosts, count, schedules(hosts, count, segment, lanes, ramp))


def test_ramp_cuts_the_first_and_last_segment():
    """2 x 4 ranks, one lane's worth: the ramp adds 2 R segments (rail_halving's talking steps grow by
    2 R segments' worth) and the first reduce-scatter message is 1/2^R of an equal segment's."""
    hosts = [h for h in range(2) for _ in range(4)]
    count, segment = 8 * 1024, 1024  # 8 equal segments
    def first_send(ramp):
        s = _C.schedule(_C.Collective.all_reduce, "rail_halving", 0, 8, count, 0, _C.DType.float32, hosts, "",
                        segment, "", 0, ramp)
        talking = [st for st in s["steps"] if any(o["op"] == "send" for o in st)]
        return next(o["src"][2] for o in talking[0] if o["op"] == "send"), len(talking)
    plain, steps0 = first_send(0)
    for ramp in (1, 2):
        first, steps = first_send(ramp)
        assert first * 2 ** ramp == plain, (ramp, first, plain)
        assert steps > steps0
    with pytest.raises(ValueError, match="share"):
        first_send(4)


def test_lanes_are_rail_halving_on_shares():
    """Lane c of 2 x 4 ranks is rail_halving's schedule of its share, moved there, padded to the
    longest lane: its talking steps are rail_halving's of count / W."""
    hosts = [h for h in range(2) for _ in range(4)]
    count, segment, W = 4 * 1024, 256, 4
    s = schedules(hosts, count, segment, W)[0]
    n = len(s["steps"])
    assert s["lanes"] == W and n % W == 0
    one = _C.schedule(_C.Collective.all_reduce, "rail_halving", 0, 8, count // W, 0, _C.DType.float32, hosts, "",
                      segment, "")
    for c in range(W):
        lane = s["steps"][c * n // W:(c + 1) * n // W]
        talking = [st for st in lane if st]
        assert len(talking) == len([st for st in one["steps"] if st])
        sends = [o["src"] for st in lane for o in st if o["op"] == "send" and o["src"][0] == "output"]
        assert all(c * count // W <= off < (c + 1) * count // W for _, off, _ in sends), c


def _lane_moved(scheds, lanes):
    """Rank 0's lane 0 cut after its first talking step: the rest of it moved into lane 1 (before lane
    1's own steps), lane 0 padded with empty steps. List order runs the same steps in the same order
    (the replay still proves the results), but messages of lane 0 on the peers are in lane 1 here."""
    bad = copy.deepcopy(scheds)
    for s in bad:  # lanes in the first form, the c-th lanes-th of the steps (_verify_custom's lanes=)
        del s["step_lanes"]
    steps = bad[0]["steps"]
    n = len(steps) // lanes
    j = next(i for i in range(n) if steps[i]) + 1
    lane0, rest = steps[:j], steps[j:]
    bad[0]["steps"] = lane0 + [[] for _ in range(len(rest) - len(lane0))] + rest
    assert len(bad[0]["steps"]) % lanes == 0
    return bad


def test_verifier_catches_a_message_crossing_lanes():
    hosts = [h for h in range(2) for _ in range(2)]
    scheds = schedules(hosts, 97, 12, 2)
    verify(hosts, 97, scheds)
    with pytest.raises(_C.VerificationError, match="crosses lanes"):
        bad = _lane_moved(scheds, 2)
        _C._verify_custom(_C.Collective.all_reduce, 4, 97, bad, 0)  # correct in list order
        verify(hosts, 97, bad)


def test_verifier_catches_lanes_sharing_an_element():
    """Lane 1's first send reads lane 0's first element: the lanes' footprints meet."""
    hosts = [h for h in range(2) for _ in range(2)]
    scheds = schedules(hosts, 96, 12, 2)
    steps = scheds[0]["steps"]
    n = len(steps) // 2
    k = next(i for i in range(n, 2 * n) if any(o["op"] == "send" for o in steps[i]))
    op = next(o for o in steps[k] if o["op"] == "send")
    op["src"] = ("input", 0, op["src"][2])
    with pytest.raises(_C.VerificationError, match="lane 0 writes .* lane 1 also reads"):
        _C._verify_custom(_C.Collective.all_reduce, 4, 96, scheds, 0, lanes=2, in_place=False)


def test_verifier_catches_unequal_lanes():
    hosts = [h for h in range(2) for _ in range(2)]
    scheds = schedules(hosts, 96, 12, 2)
    for s in scheds:  # lanes in the first form, the c-th lanes-th of the steps
        del s["step_lanes"]
    scheds[1]["steps"].append([])
    with pytest.raises(_C.VerificationError, match="lanes of equal length"):
        verify(hosts, 96, scheds)
