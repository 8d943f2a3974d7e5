"""The TCP link's data paths: zero-copy sends (the kernel reads the caller's buffer, and a send
completes only once it has), receives landed straight in the destination (bounds-checked), and
waiting callers reading their own sockets. Emulated hosts, TCP over loopback."""
import pytest

import latency_path_cases
import zero_copy_cases as cases

LOOPBACK = {"COMMLIB_SOCKET_IFNAME": "lo"}


def hosts_pool(pool, hosts, **extra):
    return pool(len(hosts), env={**LOOPBACK, "COMMLIB_HOST_ID": hosts, **extra})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("delay", [0.0, 0.3], ids=["receiver-ready", "receiver-late"])
def test_send_buffer_may_change_once_send_returns(pool, delay):
    """Overwriting the buffer right after send() returns never changes what the peer receives,
    whether the receive was posted first or part of the message waited in the ring."""
    res = hosts_pool(pool, ("a", "b", "c")).run(cases.send_then_overwrite, delay, timeout=100)
    assert [ok for ok, _, _ in res] == [True] * 3
    message = cases.LARGE * 8
    assert res[0][1] >= 2 * message  # rank 0's payloads went from its buffers, not a staging copy
    assert res[1][2] > 0 and res[1][2] <= 2 * message  # and rank 1 received some in place


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hosts", [("a", "b"), ("a", "b", "c")], ids=["1x2", "1x3"])
def test_in_place_collectives_with_uneven_chunks(pool, hosts):
    count = 1_000_003  # 4 MB of float32: uneven over ranks and over 512 KiB chunks
    for rank, bad in enumerate(hosts_pool(pool, hosts).run(cases.in_place_collectives, count, timeout=100)):
        assert not bad, f"rank {rank}: {bad}"


@pytest.mark.timeout(120)
def test_landing_stays_inside_the_destination(pool):
    res = hosts_pool(pool, ("a", "b")).run(cases.landing_stays_in_bounds, timeout=100)
    ok, intact, err = res[1]
    assert ok and intact
    assert err is not None and "370001" in err and "300001" in err, err
    assert res[0][2] is not None  # the sender learnt of the mismatch too


@pytest.mark.timeout(120)
def test_waiting_caller_reads_its_own_socket(pool):
    # A spin long enough to cover a round trip on a loaded machine: while a caller spins, the
    # progress thread leaves its sockets alone, so the caller itself must read the answers.
    res = hosts_pool(pool, ("a", "b"), **latency_path_cases.LONG_SPIN).run(latency_path_cases.round_trips, 100,
                                                                            timeout=100)
    assert all(ok for ok, _ in res)
    # not every small message went through the progress thread
    assert sum(d["frames_read_by_caller"] for _, d in res) > 0
