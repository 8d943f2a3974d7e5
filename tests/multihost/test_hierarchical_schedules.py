"""Hierarchical schedules are proven by the symbolic verifier for host maps up to 64 ranks (even,
uneven, interleaved, one rank per host), every count shape, both buffer layouts; and the verifier
rejects a hierarchical schedule with a step removed (so these proofs can fail)."""
import random

import pytest

import commlib._C as _C
from commlib.core.call_spec import COLLECTIVE

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
    return [_C.schedule(COLLECTIVE[coll], "hierarchical", r, P, count, root, _C.DType.float32, hosts) for r in range(P)]


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_verified_on_host_maps(collective):
    for hosts in host_maps():
        P = len(hosts)
        for count in sorted({0, 1, P - 1, P + 3, 97}):
            for root in (sorted({0, P // 2, P - 1}) if collective == "broadcast" else [0]):
                _C._verify_custom(COLLECTIVE[collective], P, count, schedules(collective, hosts, count, root), root)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_verifier_rejects_a_broken_one(collective):
    hosts = [0, 0, 1, 2, 2, 2]
    s = schedules(collective, hosts, 13, 0)
    victim = 4
    s[victim]["steps"] = s[victim]["steps"][:-1]
    with pytest.raises(_C.VerificationError):
        _C._verify_custom(COLLECTIVE[collective], len(hosts), 13, s, 0)


def test_bad_host_map_is_refused():
    with pytest.raises(ValueError, match="host_of"):
        _C.schedule(_C.Collective.all_reduce, "hierarchical", 0, 4, 10, 0, _C.DType.float32, [0, 1])


EQUAL_HOSTS = [[0, 1], [0, 0, 1, 1], [1, 0, 1, 0], [0, 1, 2], [0, 0, 0, 1, 1, 1], [h % 4 for h in range(16)],
               list(range(16)), [h for h in range(8) for _ in range(8)]]


def test_pipelined_all_reduce_verified(monkeypatch):
    """Equal hosts and a message of two segments or more: the pipelined all_reduce (more steps than
    the plain one) is proven for every count shape."""
    plain = {tuple(h): len(schedules("all_reduce", h, 1009, 0)[0]["steps"]) for h in EQUAL_HOSTS}
    monkeypatch.setenv("COMMLIB_HIER_SEGMENT", "7")
    for hosts in EQUAL_HOSTS:
        P = len(hosts)
        for count in sorted({0, 1, P - 1, P + 3, 14, 97, 1009}):
            _C._verify_custom(_C.Collective.all_reduce, P, count, schedules("all_reduce", hosts, count, 0), 0)
        assert len(schedules("all_reduce", hosts, 1009, 0)[0]["steps"]) > plain[tuple(hosts)]


def uneven_host_maps():
    rng = random.Random(1301)
    maps = [[0, 0, 1, 2, 2, 2], [0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 2, 3, 3], [2, 2, 0, 1, 1, 0, 3],
            [0, 1, 0, 1, 1], [0] * 7 + [1]]
    for P in (16, 37, 64):
        maps.append([rng.randrange(1 + P // 8) for _ in range(P)])
    return maps


def test_pipelined_all_reduce_verified_on_uneven_hosts(monkeypatch):
    """Uneven hosts (2+1+3, 1+4, 3+3+1+2, interleaved, random maps to 64 ranks) take the pipelined
    path too (segments of 7 elements: counts of 14 and more span 2 to 16 segments) and it is proven
    for counts 0, 1, < ranks, primes, in place and out of place; below two segments the plain
    schedule runs (a count of 13 builds the same schedule as with pipelining off)."""
    monkeypatch.setenv("COMMLIB_HIER_SEGMENT", "1000000000")
    plain = {tuple(h): [schedules("all_reduce", h, c, 0) for c in (13, 1009)] for h in uneven_host_maps()}
    monkeypatch.setenv("COMMLIB_HIER_SEGMENT", "7")
    for hosts in uneven_host_maps():
        P = len(hosts)
        assert len({hosts.count(h) for h in hosts}) > 1  # the map is uneven
        for count in sorted({0, 1, P - 1, 13, 14, 23, 97, 1009}):
            _C._verify_custom(_C.Collective.all_reduce, P, count, schedules("all_reduce", hosts, count, 0), 0)
        small, large = plain[tuple(hosts)]
        assert schedules("all_reduce", hosts, 13, 0) == small
        assert len(schedules("all_reduce", hosts, 1009, 0)[0]["steps"]) > len(large[0]["steps"])


@pytest.mark.parametrize("hosts", [[0, 0, 1, 1], [0, 0, 1, 2, 2, 2]], ids=["2x2", "2+1+3"])
def test_verifier_rejects_a_broken_pipeline(monkeypatch, hosts):
    """Each rank's last receiving step removed in turn (the final all-gather, or on a one-rank host
    the last inter-host exchange): the verifier must refuse every one."""
    monkeypatch.setenv("COMMLIB_HIER_SEGMENT", "7")
    for victim in range(len(hosts)):
        s = schedules("all_reduce", hosts, 97, 0)
        steps = s[victim]["steps"]
        del steps[max(k for k, st in enumerate(steps) if any(op["op"] == "recv" for op in st))]
        with pytest.raises(_C.VerificationError):
            _C._verify_custom(_C.Collective.all_reduce, len(hosts), 97, s, 0)


def test_bad_segment_setting_is_refused(monkeypatch):
    monkeypatch.setenv("COMMLIB_HIER_SEGMENT", "0")
    with pytest.raises(ValueError, match="COMMLIB_HIER_SEGMENT"):
        _C.schedule(_C.Collective.all_reduce, "hierarchical", 0, 4, 100, 0, _C.DType.float32, [0, 0, 1, 1])
