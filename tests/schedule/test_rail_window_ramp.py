"""rail_window's ramp (schedule/rail_window.cc, session 27: `share >> 16` = R): the first and the last
segment each cut in R + 1 lanes of 1/2^R, 1/2^R, 2/2^R, .., 1/2 of a segment, K + 2R lanes in all.
Proven by the verifier (both layouts; its lane checks: no two lanes touch one element, every message
in one lane) on the host maps where the lanes apply, with awkward counts, windows and staggers; the
ramp's lanes hold the pieces it says; a ramp that does not fit is left out; the segments' intra phases by
recursive halving or direct under a ramp (session 29); the intra window (session 32: `share >> 24`)."""
import pytest

from commlib import _C

PAIRED = [[h for h in range(H) for _ in range(L)] for H, L in ((2, 2), (2, 4), (4, 2), (4, 4), (8, 8))]


def schedules(hosts, count, segment, window=0, ramp=0, stagger=0, intra="", intra_window=0):
    P = len(hosts)
    return [_C.schedule(_C.Collective.all_reduce, "rail_window", r, P, count, 0, _C.DType.float32, hosts, "",
                        segment, intra, window, (intra_window << 24) | (ramp << 16) | stagger) for r in range(P)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", PAIRED, ids=lambda h: "x".join(map(str, [len(set(h)), len(h)])))
def test_ramped_window_is_verified(hosts):
    P = len(hosts)
    # (count, segment, window, ramp, stagger, lanes): K 8 with R 1, K 16 (a prime's remainder) with
    # R 2, K 64 with R 3 under a wide window and a stagger, a ramp too deep for its pieces (left
    # out: K lanes), and too few elements for any segment (one lane).
    cases = [(P * 8 * 8 + 5, P * 8, 0, 1, 0, 8 + 2), (P * 16 * 8 + 3, P * 8, 0, 2, 0, 16 + 4),
             (P * 64 * 16 + 7, P * 16, 40, 3, 3, 64 + 6), (P * 2 * 8, P * 8, 0, 20, 0, 2), (97, 7, 0, 2, 0, 1)]
    # The segments' intra phases by recursive halving or direct (session 29) under the ramp: K 8, R 2
    # (up to 16 ranks: at 64 the two cases would double the module's time).
    if P <= 16:
        cases += [(P * 8 * 8 + 5, P * 8, 0, 2, 0, 8 + 4, intra) for intra in ("recursive_halving", "direct")]
    for count, segment, window, ramp, stagger, lanes, *intra in cases:
        scheds = schedules(hosts, count, segment, window, ramp, stagger, *intra)
        assert {s["lanes"] for s in scheds} == {lanes}, (count, ramp, scheds[0]["lanes"])
        for in_place in (False, True):
            _C._verify_custom(_C.Collective.all_reduce, P, count, scheds, 0, lanes=lanes, in_place=in_place)


def test_the_ramps_lanes_hold_its_pieces():
    """2 x 4 ranks, 8 segments of 1024 elements, R 2: lanes 0-2 hold 256, 256 and 512 elements of
    segment 0 (each lane's sends inside its piece), lanes 3-8 segments 1-6 whole, lanes 9-11 512, 256
    and 256 of segment 7; the stagger (low 16 bits of share) still orders the list."""
    hosts = [h for h in range(2) for _ in range(4)]
    s = schedules(hosts, 8 * 1024, 1024, ramp=2)[0]
    assert s["lanes"] == 12
    ends = [0, 256, 512, 1024, 2048, 3072, 4096, 5120, 6144, 7168, 7680, 7936, 8192]
    for lane in range(12):
        sends = [o["src"] for st, k in zip(s["steps"], s["step_lanes"]) if k == lane for o in st
                 if o["op"] == "send" and o["src"][0] != "scratch"]
        assert sends and all(ends[lane] <= off and off + n <= ends[lane + 1] for _, off, n in sends), lane
    n = s["window"]
    staggered = schedules(hosts, 8 * 1024, 1024, ramp=2, stagger=n)[0]["step_lanes"]
    assert staggered == sorted(staggered)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", PAIRED, ids=lambda h: "x".join(map(str, [len(set(h)), len(h)])))
def test_intra_window_is_verified(hosts):
    """The intra window (session 32, `share >> 24` = E: ir.h Schedule::intra_window, at most E of a
    rank's steps inside the host in flight) only holds steps back: the steps are E 0's, every rank
    carries E, the verifier proves the schedules (both layouts, its lane checks), with the ramp and
    the direct intra phases as auto's shape has them, and refuses ranks that disagree on E."""
    P = len(hosts)
    count, segment = P * 16 * 8 + 3, P * 8
    # (at 64 ranks the ring's segments only: the intra phases' cases would double the module's time)
    cases = ((1, 0, ""), (3, 2, "direct"), (3, 2, "recursive_halving")) if P <= 16 else ((3, 1, ""),)
    for E, ramp, intra in cases:
        scheds = schedules(hosts, count, segment, 0, ramp, 0, intra, E)
        plain = schedules(hosts, count, segment, 0, ramp, 0, intra)
        assert [s["intra_window"] for s in scheds] == [E] * P
        assert [s["steps"] for s in scheds] == [s["steps"] for s in plain]
        assert [s["step_lanes"] for s in scheds] == [s["step_lanes"] for s in plain]
        lanes = scheds[0]["lanes"]
        for in_place in (False, True):
            _C._verify_custom(_C.Collective.all_reduce, P, count, scheds, 0, lanes=lanes, in_place=in_place)
    scheds[-1] = dict(scheds[-1], intra_window=E + 1)
    with pytest.raises(Exception, match="intra window"):
        _C._verify_custom(_C.Collective.all_reduce, P, count, scheds, 0, lanes=lanes)
