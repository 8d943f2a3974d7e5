"""rail_halving all_reduce (csrc/schedule/rail_halving.cc): hierarchical all_reduce whose intra-host
phases halve and double, whose inter-host phase is rabenseifner per rail, overlapped segment by
segment and paired by elements (hierarchical_overlap.cc, merge_by_elements). Proven by the symbolic
verifier (in place and out of place) on the host maps where that shape runs (equal power-of-two
hosts, 2 to 64 ranks) and where it falls back to hierarchical rabenseifner/ring (one host, odd and
uneven hosts, interleaved host ids, one rank per host), with awkward counts (0, 1, fewer than the
ranks, primes) and 1 to 16 segments; its steps pair the rounds and steps of equal size; its step
count is pinned."""
import math

import pytest

from commlib import _C

# Equal power-of-two hosts: the paired shape. 8 x 8: 64 ranks, the DGX host at 8 hosts.
PAIRED = [[h for h in range(H) for _ in range(L)] for H, L in ((2, 2), (2, 4), (4, 2), (4, 4), (2, 8), (8, 2), (8, 8))]
# The fallback: one host, 3 x 3 (odd), 3 hosts of 4 (odd count of hosts), uneven, interleaved, one rank per host.
FALLBACK = [[0] * 4, [h for h in range(3) for _ in range(3)], [h for h in range(3) for _ in range(4)],
            [0, 0, 1, 2, 2, 2], [1, 0, 1, 0, 2, 2], [0, 1, 2, 3]]


def schedules(hosts, count, segment):
    P = len(hosts)
    return [_C.schedule(_C.Collective.all_reduce, "rail_halving", r, P, count, 0, _C.DType.float32, hosts, "",
                        segment, "") for r in range(P)]


def talking(sched):
    return [st for st in sched["steps"] if any(o["op"] in ("send", "recv", "recv_reduce") for o in st)]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("hosts", PAIRED + FALLBACK, ids=lambda h: "x".join(map(str, [len(set(h)), len(h)])))
def test_verified_on_host_maps(hosts):
    P = len(hosts)
    # count, segment: 0 and 1 (one segment), fewer than the ranks, a prime over 2 and 16 segments,
    # blocks of several elements per rank and segment.
    cases = [(0, 0), (1, 1), (max(1, P - 1), 1), (97, 49), (97, 6), (P * 8 * 4 + 3, P * 8)]
    if P == 64:
        cases = [(1, 1), (97, 7), (64 * 16 + 5, 64 * 4)]  # the verifier's time grows with P x steps
    for count, segment in cases:
        _C._verify_custom(_C.Collective.all_reduce, P, count, schedules(hosts, count, segment), 0)


@pytest.mark.parametrize("H,L,K", [(2, 4, 4), (4, 4, 8), (8, 2, 16), (2, 8, 16)])
def test_step_count_and_pairing(H, L, K):
    """Tick t (-1..K) holds the reduce-scatter of t+1 (log L rounds, halving), the inter-host
    all-reduce of t (2 log H steps) and the all-gather of t-1 (log L rounds, doubling); paired by
    elements, a full tick has max(2 log L, 2 log H) talking steps and the first and last ticks'
    lone phases log L each. Rank 0's count is pinned; with H >= L every intra round sits beside the
    inter step of the same place in its halving or doubling (its messages L times the inter
    step's: one NIC per local rank against one port, so on a rail-optimised host a pair takes about
    the time of either half)."""
    hosts = [h for h in range(H) for _ in range(L)]
    P, lL, lH = H * L, int(math.log2(L)), int(math.log2(H))
    segment = 1 << 12
    count = K * segment  # blocks divide evenly: exact halving
    s = schedules(hosts, count, segment)[0]
    per_full_tick = max(2 * lL, 2 * lH)
    # Ticks 0 and K-1 miss one intra phase: the inter lane's 2 log H steps beside log L rounds.
    edge = max(lL, 2 * lH) if K > 1 else 0
    want = lL + 2 * edge + (K - 2) * per_full_tick + lL
    assert len(talking(s)) == want, (len(talking(s)), want)
    if H < L:
        return
    pairs = 0
    for st in talking(s):
        intra = [o["src"][2] for o in st if o["op"] == "send" and hosts[o["peer"]] == hosts[0]]
        inter = [o["src"][2] for o in st if o["op"] == "send" and hosts[o["peer"]] != hosts[0]]
        if intra and inter:
            assert intra[0] == inter[0] * L, (intra, inter)
            pairs += 1
    assert pairs == 2 * lL * (K - 1)  # every intra round has its inter step but the fill's and the drain's


def test_inter_messages_are_logarithmic():
    """Per segment a rank sends 2 log H messages to other hosts (rabenseifner per rail), all to its
    own local index on the other hosts (its rail), where two_shot sends 2 (H - 1)."""
    H, L, K = 8, 2, 4
    hosts = [h for h in range(H) for _ in range(L)]
    s = schedules(hosts, K * 4096, 4096)
    for r in range(H * L):
        inter = [o["peer"] for st in s[r]["steps"] for o in st if o["op"] == "send" and hosts[o["peer"]] != hosts[r]]
        assert len(inter) == K * 2 * int(math.log2(H))
        assert all(p % L == r % L for p in inter)  # rail-aligned: local index i to local index i
