"""rail_window's segments with their inter-host phase by recursive quartering (CollArgs::inter_algorithm
"radix4", schedule/radix_exchange.h; session 33): proven by the verifier (in place and out of place,
the lane checks) on the host maps where the lanes apply, 2 to 32 hosts (one round of 2, of 4, 4 and 2,
4 and 4, 4, 4 and 2) up to 64 ranks, with the ring and direct inside the hosts, awkward counts, the
ramp, windows and the intra window; a lane's messages between hosts are 3 a round in log4 H rounds
(rabenseifner's 1 a round in log2 H); a name rail_window does not take is refused."""
import pytest

from commlib import _C

MAPS = [[h for h in range(H) for _ in range(L)] for H, L in ((2, 2), (4, 2), (4, 4), (8, 2), (8, 8), (16, 4), (32, 2))]


def schedules(hosts, count, segment, inter="radix4", intra="", window=0, share=0):
    P = len(hosts)
    return [_C.schedule(_C.Collective.all_reduce, "rail_window", r, P, count, 0, _C.DType.float32, hosts, inter,
                        segment, intra, window, share) for r in range(P)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", MAPS, ids=lambda h: "x".join(map(str, [len(set(h)), len(h) // len(set(h))])))
def test_verified_on_host_maps(hosts):
    P = len(hosts)
    # (count, segment, intra, window, share): fewer elements than ranks in a segment (one lane),
    # primes, 2 to 16 segments, the ramp R 2, a window, the intra window E 2 with direct.
    cases = [(1, 1, "", 0, 0), (97, 49, "direct", 0, 0), (P * 8 * 4 + 3, P * 8, "", 0, 0),
             (P * 8 * 8 + 5, P * 8, "direct", 0, 2 << 16), (P * 4 * 16 + 1, P * 4, "direct", 40, 2 << 24 | 2 << 16)]
    if P == 64:
        cases = [(97, 7, "", 0, 0), (64 * 8 * 4 + 5, 64 * 8, "direct", 0, 2 << 24 | 2 << 16)]
    for count, segment, intra, window, share in cases:
        scheds = schedules(hosts, count, segment, intra=intra, window=window, share=share)
        _C._verify_custom(_C.Collective.all_reduce, P, count, scheds, 0, lanes=scheds[0]["lanes"])  # (both layouts)


def lane0_between(hosts, inter):
    """Lane 0 of rank 0: its talking steps between hosts and the peers each names."""
    s = schedules(hosts, 4 * len(hosts) * 64, len(hosts) * 64, inter=inter, intra="direct")[0]
    assert s["lanes"] == 4
    steps = [st for st, lane in zip(s["steps"], s["step_lanes"]) if lane == 0]
    return [sorted(o["peer"] for o in st if o["op"] == "send" and hosts[o["peer"]] != 0) for st in steps
            if any(o["op"] == "send" and hosts[o["peer"]] != 0 for o in st)]


def test_rounds_of_four_between_hosts():
    """16 hosts x 2: rabenseifner's 2 x 4 rounds of one message a rank, recursive quartering's 2 x 2
    rounds of three (the three others of the rank's group of four: local rank 0 of hosts differing in
    one base-4 digit); 8 hosts: a round of 4 and a round of 2 each way."""
    hosts = [h for h in range(16) for _ in range(2)]
    assert [len(p) for p in lane0_between(hosts, "")] == [1] * 8
    assert lane0_between(hosts, "rabenseifner") == lane0_between(hosts, "")
    rounds = lane0_between(hosts, "radix4")
    assert rounds == [[8, 16, 24], [2, 4, 6], [2, 4, 6], [8, 16, 24]]  # (rank 2h: local rank 0 of host h)
    hosts = [h for h in range(8) for _ in range(2)]
    assert lane0_between(hosts, "radix4") == [[4, 8, 12], [2], [2], [4, 8, 12]]


def test_bad_inter_algorithm_names_it():
    hosts = [h for h in range(4) for _ in range(2)]
    with pytest.raises(ValueError, match="inter_algorithm"):
        schedules(hosts, 8 * 64 * 4, 8 * 64, inter="ring")
    with pytest.raises(ValueError, match="inter_algorithm"):
        schedules([0, 1], 96, 24, inter="nope")  # (one lane there: still refused)
