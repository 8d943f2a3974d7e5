"""rail_window all_reduce (csrc/schedule/rail_window.cc): each segment's rail_halving (plain form) in a
lane of its own (ir.h Step::lane), listed in pipelined order under a window of steps in flight
(ir.h Schedule::window). Proven by the verifier (in place and out of place) on the host maps where
the lanes apply (equal power-of-two hosts, 4 to 64 ranks) and where it is one lane (one host, odd
and uneven hosts, interleaved host ids, one rank per host), with awkward counts (0, 1, fewer than
the ranks, primes), 2 to 64 segments, windows and staggers; and the lane checks
(verify/verifier_lanes.cc) reject windowed schedules whose in-flight steps could meet: two lanes
touching one element, a message whose ends are in different lanes, a step outside the lanes, ranks
with different windows. The segments' intra-host phases by recursive halving and doubling or direct
(session 29) on the same host maps, fewer cases."""
import copy

import pytest

from commlib import _C

PAIRED = [[h for h in range(H) for _ in range(L)] for H, L in ((2, 2), (2, 4), (4, 2), (4, 4), (2, 8), (8, 8))]
ONE_LANE = [[0] * 4, [h for h in range(3) for _ in range(3)], [0, 0, 1, 2, 2, 2], [1, 0, 1, 0, 2, 2], [0, 1, 2, 3]]


def schedules(hosts, count, segment, window=0, stagger=0, intra=""):
    P = len(hosts)
    return [_C.schedule(_C.Collective.all_reduce, "rail_window", r, P, count, 0, _C.DType.float32, hosts, "",
                        segment, intra, window, stagger) for r in range(P)]


def step_lanes(s):
    """Each step's lane (a schedule of one lane names none)."""
    return s.get("step_lanes", [0] * len(s["steps"]))


def verify(hosts, count, scheds):
    _C._verify_custom(_C.Collective.all_reduce, len(hosts), count, scheds, 0, lanes=scheds[0]["lanes"])


def lanes_expected(hosts, count, segment):
    P = len(hosts)
    if hosts not in PAIRED or segment <= 0:
        return 1
    K = min(count // segment, 64)
    return K if K >= 2 and count // K >= 2 * P else 1


@pytest.mark.timeout(600)
@pytest.mark.parametrize("hosts", PAIRED + ONE_LANE, ids=lambda h: "x".join(map(str, [len(set(h)), len(h)])))
def test_verified_on_host_maps(hosts):
    P = len(hosts)
    # (count, segment, window, stagger): empty, one element, fewer than the ranks, primes over 2 to
    # 64 segments, the default window (one segment's steps), one step in flight, a wide window, a
    # stagger of a few steps.
    cases = [(0, 0, 0, 0), (1, 1, 0, 0), (max(1, P - 1), 1, 0, 0), (97, 49, 0, 0), (P * 8 * 4 + 3, P * 8, 0, 0),
             (P * 8 * 8 + 5, P * 2, 1, 0), (P * 8 * 3 + 1, P * 3, 40, 3), (P * 2 * 64 + 7, P * 2, 0, 2)]
    if P == 64:
        cases = [(1, 1, 0, 0), (97, 7, 0, 0), (64 * 16 + 5, 64 * 4, 0, 2), (64 * 2 * 8 + 3, 64 * 2, 6, 1)]
    for count, segment, window, stagger in cases:
        scheds = schedules(hosts, count, segment, window, stagger)
        want = lanes_expected(hosts, count, segment)
        assert all(s["lanes"] == want for s in scheds), (count, segment, scheds[0]["lanes"], want)
        assert {max(step_lanes(s), default=0) for s in scheds} <= set(range(want))
        if want > 1:
            assert {len(set(step_lanes(s))) for s in scheds} == {want}, count  # every lane has steps
            assert {s["window"] for s in scheds} == {window or scheds[0]["window"]} and scheds[0]["window"] > 0
        verify(hosts, count, scheds)


INTRA = ("recursive_halving", "direct")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", PAIRED + ONE_LANE, ids=lambda h: "x".join(map(str, [len(set(h)), len(h)])))
def test_intra_phases_verified_on_host_maps(hosts):
    """rail_window with its segments' reduce-scatter and all-gather inside the hosts by recursive
    halving and doubling, or direct (CollArgs::intra_algorithm): the verifier's proof (both layouts,
    the lane checks) with awkward counts, a window and a stagger; on the one-lane maps the name is
    taken and rail_halving's plain form runs."""
    P = len(hosts)
    cases = [(1, 1, 0, 0), (97, 49, 0, 0), (P * 8 * 4 + 3, P * 8, 0, 0), (P * 8 * 3 + 1, P * 3, 40, 3)]
    if P == 64:
        cases = [(97, 7, 0, 0), (64 * 8 * 2 + 5, 64 * 2, 0, 2)]
    for intra in INTRA:
        for count, segment, window, stagger in cases:
            scheds = schedules(hosts, count, segment, window, stagger, intra)
            want = lanes_expected(hosts, count, segment)
            assert all(s["lanes"] == want for s in scheds), (intra, count, segment, scheds[0]["lanes"], want)
            verify(hosts, count, scheds)


def test_intra_phases_take_their_rounds():
    """2 x 8 ranks, 4 segments: a lane's messages inside the host are the ring's 2 (L - 1) = 14 by
    default, recursive halving and doubling's 2 log2 L = 6, direct's 2 x 7 in two steps; its messages
    between hosts (rabenseifner per rail, 2 log2 H = 2) are the same in all three; a name neither
    registered for both phases nor recursive_halving is refused, naming the argument."""
    hosts = [h for h in range(2) for _ in range(8)]
    count, segment = 4 * 16 * 64, 16 * 64

    def lane0(intra):
        s = schedules(hosts, count, segment, intra=intra)[0]
        assert s["lanes"] == 4
        steps = [st for st, lane in zip(s["steps"], s["step_lanes"]) if lane == 0]
        inside = [o for st in steps for o in st if o["op"] == "send" and hosts[o["peer"]] == 0]
        talking = [st for st in steps if any(o["op"] == "send" and hosts[o["peer"]] == 0 for o in st)]
        between = [o for st in steps for o in st if o["op"] == "send" and hosts[o["peer"]] == 1]
        return len(inside), len(talking), len(between)

    assert lane0("") == (14, 14, 2)
    assert lane0("recursive_halving") == (6, 6, 2)
    assert lane0("direct") == (14, 2, 2)
    with pytest.raises(ValueError, match="intra_algorithm"):
        schedules(hosts, count, segment, intra="recursive_doubling")
    with pytest.raises(ValueError, match="intra_algorithm"):
        schedules([0, 1], 96, 24, intra="nope")  # (one lane there: still refused)


def test_each_lane_is_one_segments_rail_halving_in_pipelined_order():
    """2 x 4 ranks, 8 segments: lane p's steps are rail_halving's plain schedule of segment p (its
    talking steps, sends inside segment p's range), and the list holds segment p's step j before
    segment p + 1's step j (stagger 1): lane p + 1 starts one step after lane p. The window is one
    segment's steps unless given."""
    hosts = [h for h in range(2) for _ in range(4)]
    count, segment = 8 * 1024, 1024
    s = schedules(hosts, count, segment)[0]
    one = _C.schedule(_C.Collective.all_reduce, "rail_halving", 0, 8, segment, 0, _C.DType.float32, hosts, "", 0, "")
    n = len([st for st in one["steps"] if st])
    assert s["lanes"] == 8 and s["window"] == n
    lanes = s["step_lanes"]
    for p in range(8):
        mine = [st for st, lane in zip(s["steps"], lanes) if lane == p]
        assert len(mine) == n
        sends = [o["src"] for st in mine for o in st if o["op"] == "send" and o["src"][0] != "scratch"]
        assert sends and all(p * segment <= off < (p + 1) * segment for _, off, _ in sends), p
        first = lanes.index(p)
        assert first == p * (p + 1) // 2 + p, (p, first)  # diagonal order: keys of 1, 2, 3 .. steps
    assert lanes[:6] == [0, 0, 1, 0, 1, 2]
    assert schedules(hosts, count, segment, window=3)[0]["window"] == 3
    staggered = schedules(hosts, count, segment, stagger=n)[0]["step_lanes"]
    assert staggered == sorted(staggered)  # a stagger of a whole segment: lane after lane


def _two_lanes():
    hosts = [h for h in range(2) for _ in range(2)]
    count = 4 * 96
    scheds = schedules(hosts, count, count // 2, window=4)
    assert scheds[0]["lanes"] == 2
    verify(hosts, count, scheds)
    return hosts, count, scheds


def test_verifier_rejects_in_flight_steps_touching_one_element():
    """Rank 0's first send of lane 1 reads lane 0's first output element: with both lanes in
    flight the read races lane 0's writes there (in list order the replay alone would not see it
    when the values happen to agree)."""
    hosts, count, scheds = _two_lanes()
    bad = copy.deepcopy(scheds)
    s = bad[0]
    k = next(i for i, (st, lane) in enumerate(zip(s["steps"], s["step_lanes"])) if lane == 1 and
             any(o["op"] == "send" for o in st))
    op = next(o for o in s["steps"][k] if o["op"] == "send")
    op["src"] = ("output", 0, op["src"][2])
    with pytest.raises(_C.VerificationError, match="lane 0 writes .* lane 1 also reads"):
        _C._verify_custom(_C.Collective.all_reduce, 4, count, bad, 0, lanes=2, in_place=False)


def test_verifier_rejects_a_message_crossing_lanes():
    """Rank 0 files its first talking step under the other lane: in list order nothing changes (the
    replay proves it), but its message would match the peer's other lane."""
    hosts, count, scheds = _two_lanes()
    bad = copy.deepcopy(scheds)
    s = bad[0]
    k = next(i for i, st in enumerate(s["steps"]) if any(o["op"] == "send" for o in st))
    s["step_lanes"][k] = 1 - s["step_lanes"][k]
    _C._verify_custom(_C.Collective.all_reduce, 4, count, [dict(x, step_lanes=[0] * len(x["steps"])) for x in bad], 0,
                      lanes=1)  # one lane: the list order is right
    with pytest.raises(_C.VerificationError, match="crosses lanes"):
        verify(hosts, count, bad)


def test_verifier_rejects_a_step_outside_the_lanes_and_unequal_windows():
    hosts, count, scheds = _two_lanes()
    bad = copy.deepcopy(scheds)
    bad[3]["step_lanes"][-1] = 2
    with pytest.raises(_C.VerificationError, match="lane 2, outside the schedule's 2 lanes"):
        verify(hosts, count, bad)
    bad = copy.deepcopy(scheds)
    bad[2]["window"] = 3
    with pytest.raises(_C.VerificationError, match="rank 2 has window 3, rank 0 4"):
        verify(hosts, count, bad)
    bad[2]["window"] = -1
    bad[0]["window"] = -1
    with pytest.raises(_C.VerificationError, match="window -1"):
        verify(hosts, count, bad)


def test_bad_arguments_name_them():
    hosts = [h for h in range(2) for _ in range(2)]
    with pytest.raises(ValueError, match="pieces"):
        schedules(hosts, 96, 24, window=-1)
    with pytest.raises(ValueError, match="share"):
        schedules(hosts, 96, 24, stagger=-2)
