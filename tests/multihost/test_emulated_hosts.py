"""Ranks on several emulated hosts (COMMLIB_HOST_ID per rank): shared memory within a host, TCP
over loopback between hosts. Every collective x algorithm: one full sweep on 2 hosts x 2 ranks,
and a covering selection on uneven hosts (2+1+3) and on one rank per host."""
import pytest

import multihost_cases as cases

LOOPBACK = {"COMMLIB_SOCKET_IFNAME": "lo"}
TWO_BY_TWO = ("a", "a", "b", "b")
UNEVEN = ("a", "a", "b", "c", "c", "c")
ONE_PER_HOST = ("a", "b", "c")


def hosts_pool(pool, hosts, **extra):
    return pool(len(hosts), env={**LOOPBACK, "COMMLIB_HOST_ID": hosts, **extra})


@pytest.mark.timeout(300)
def test_full_sweep_two_hosts_of_two(pool):
    failures = [f for fails in hosts_pool(pool, TWO_BY_TWO).run(cases.matrix, True, timeout=280) for f in fails]
    assert not failures, "\n".join(failures[:20])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", [UNEVEN, ONE_PER_HOST], ids=["uneven-2+1+3", "one-rank-per-host"])
def test_covering_selection(pool, hosts):
    failures = [f for fails in hosts_pool(pool, hosts).run(cases.matrix, False, timeout=280) for f in fails]
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("hosts", [TWO_BY_TWO, UNEVEN, ONE_PER_HOST], ids=["2x2", "2+1+3", "1x3"])
def test_topology_names_hosts_and_links(pool, hosts):
    names = sorted(set(hosts), key=hosts.index)
    for rank, (got_hosts, host_of, links) in enumerate(hosts_pool(pool, hosts).run(cases.topology)):
        assert got_hosts == names
        assert host_of == [names.index(h) for h in hosts]
        want = ["self" if q == rank else "shm" if hosts[q] == hosts[rank] else "tcp" for q in range(len(hosts))]
        assert links == want


def test_point_to_point_across_hosts(pool):
    assert hosts_pool(pool, UNEVEN).run(cases.p2p_ring) == [[True] * 3] * len(UNEVEN)


def test_ipv6_loopback(pool):
    """COMMLIB_SOCKET_FAMILY=AF_INET6: the links listen on ::1 and carry the same collectives."""
    p = hosts_pool(pool, ONE_PER_HOST, COMMLIB_SOCKET_FAMILY="AF_INET6")
    assert all(a.startswith("[::1]:") for a in p.run(cases.tcp_port))
    assert p.run(cases.still_works) == [True] * 3


def test_auto_uses_hierarchical_across_shared_hosts(pool):
    """auto is keyed by link kind: ranks on several hosts with shm inside a host get the
    hierarchical schedules; one rank per host (all TCP) and an explicit override do not."""
    two_by_two = hosts_pool(pool, TWO_BY_TWO).run(cases.auto_choices)[0]
    assert two_by_two["all_reduce"] == two_by_two["broadcast"] == two_by_two["all_gather"] == "hierarchical"
    assert two_by_two["all_to_all"] != "hierarchical"  # no such schedule
    flat = hosts_pool(pool, ONE_PER_HOST).run(cases.auto_choices)[0]
    assert "hierarchical" not in flat.values()
    pinned = hosts_pool(pool, TWO_BY_TWO, COMMLIB_ALGO_ALL_REDUCE="ring").run(cases.auto_choices)[0]
    assert pinned["all_reduce"] == "ring" and pinned["broadcast"] == "hierarchical"


@pytest.mark.parametrize("hosts", [TWO_BY_TWO, ("a", "b", "a", "b", "a", "b"), UNEVEN],
                         ids=["2x2", "2x3-interleaved", "uneven-2+1+3"])
def test_pipelined_hierarchical_all_reduce(pool, hosts, monkeypatch):
    """Segments of 64 elements: 3 to 16 segments, the last ones uneven; exact for integers and
    bitwise identical floats on every rank, in place and out of place; and every rank ran the
    pipelined schedule (the one built here with the same segment, not the plain one)."""
    import pipelined_cases
    import commlib._C as _C

    counts = [64 * 3 + 5, 64 * 7 + 1, 5003]
    got = hosts_pool(pool, hosts, COMMLIB_HIER_SEGMENT="64").run(pipelined_cases.pipelined_all_reduce, counts)
    host_of = [sorted(set(hosts), key=hosts.index).index(h) for h in hosts]
    for count, per_count in zip(counts, zip(*got)):
        assert all(exact_in and exact_out for exact_in, exact_out, _, _ in per_count)
        assert len({digest for _, _, digest, _ in per_count}) == 1
        for rank, (_, _, _, digest) in enumerate(per_count):
            build = lambda: pipelined_cases.schedule_digest(  # noqa: E731
                _C.schedule(_C.Collective.all_reduce, "hierarchical", rank, len(hosts), count, 0, _C.DType.int32, host_of))
            monkeypatch.setenv("COMMLIB_HIER_SEGMENT", "1000000000")
            plain = build()
            monkeypatch.setenv("COMMLIB_HIER_SEGMENT", "64")
            assert digest == build() != plain, (rank, count)
