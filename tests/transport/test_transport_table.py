"""The transport table (csrc/transport/registry.h): an ordered list of transports, the first that
can connect a pair carries it. Unit checks of the choice, then ranks on emulated hosts
(COMMLIB_HOST_ID) checking per pair that the link kind reported is the transport carrying the bytes."""
import pytest

from commlib import _C

import transport_table_cases as cases


def test_table_order_is_shm_then_tcp():
    assert _C.transport_table() == ["shm", "tcp"]


@pytest.mark.parametrize("host_of, rank, want", [
    ([0, 0, 0], 1, ["shm", "self", "shm"]),
    ([0, 1, 0, 2], 0, ["self", "tcp", "shm", "tcp"]),
    ([0, 1, 1, 0], 2, ["tcp", "shm", "self", "tcp"]),
], ids=["one-host", "mixed", "mixed-middle"])
def test_first_entry_that_connects_wins(host_of, rank, want):
    # The endpoint "reaches" every other rank, same host or not: shm, listed first, still wins
    # the ranks of this host, and tcp takes only the rest.
    net = [q != rank for q in range(len(host_of))]
    assert _C.transport_choice(rank, host_of, True, net) == want


def test_tcp_takes_only_what_its_endpoint_reaches():
    host_of = [0, 1, 1]
    assert _C.transport_choice(0, host_of, True, [False, True, True]) == ["self", "tcp", "tcp"]
    with pytest.raises(ValueError, match="no transport connects rank 0 to rank 2 .shm: another host; "
                                         "tcp: the TcpEndpoint does not reach rank 2"):
        _C.transport_choice(0, host_of, True, [False, True, False])
    with pytest.raises(ValueError, match="no transport connects rank 0 to rank 1.*TcpEndpoint"):
        _C.transport_choice(0, host_of, True, [])


def test_shm_needs_the_host_region():
    with pytest.raises(ValueError, match="no transport connects rank 1 to rank 0 .shm: same host, no shared-memory"):
        _C.transport_choice(1, [0, 0], False, [])


def test_bad_rank_is_named():
    with pytest.raises(ValueError, match="rank: out of range"):
        _C.transport_choice(3, [0, 0], True, [])


@pytest.mark.timeout(120)
def test_each_pair_rides_the_chosen_transport(pool):
    # Mixed (shm pairs and tcp pairs); the same pool as tests/multihost/test_emulated_hosts.py's
    # 2x2 map (same environment), so a whole-suite run starts no extra ranks for it.
    hosts = ("a", "a", "b", "b")
    p = pool(len(hosts), env={"COMMLIB_SOCKET_IFNAME": "lo", "COMMLIB_HOST_ID": hosts})
    for rank, by_peer in enumerate(p.run(cases.carriers, timeout=100)):
        for peer, (kind, over_tcp) in by_peer.items():
            want = "shm" if hosts[peer] == hosts[rank] else "tcp"
            assert (kind, over_tcp) == (want, want == "tcp"), f"rank {rank} -> rank {peer}"
