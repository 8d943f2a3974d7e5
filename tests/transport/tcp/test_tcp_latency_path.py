"""The TCP small-message path (csrc/transport/tcp/tcp_spin.cc, lane_read in tcp_recv.cc): a waiting
caller keeps its sockets between calls and the progress thread takes them back once it stops
polling; a small frame is one recv; read-ahead bytes survive a full ring and frames cut across
reads. Emulated hosts, TCP over loopback. Each case sets up the state it checks (whether the caller
holds its sockets), so the order of the tests, and of test_tcp_zero_copy.py's sharing the pool,
does not matter."""
import pytest

import latency_path_cases as cases

LOOPBACK = {"COMMLIB_SOCKET_IFNAME": "lo"}
LONG_SPIN = cases.LONG_SPIN


def hosts_pool(pool, hosts, **extra):
    return pool(len(hosts), env={**LOOPBACK, "COMMLIB_HOST_ID": hosts, **extra})


@pytest.mark.timeout(120)
def test_small_frames_take_one_recv_and_the_caller_keeps_its_sockets(pool):
    n = 200
    res = hosts_pool(pool, ("a", "b"), **LONG_SPIN).run(cases.round_trips, n, timeout=100)
    for ok, d in res:
        assert ok
        # Header, chunk header and payload of each frame come in one recv (three before), plus
        # the few control frames (the call, every 50 ms).
        assert d["recv_reads"] <= 1.5 * n, d
        # One take at the first wait, again only after the progress thread took the sockets back
        # (2 ms without a poll); one per call before.
        assert 1 <= d["caller_takes"] <= n // 4, d


@pytest.mark.timeout(120)
def test_progress_thread_reads_for_a_rank_busy_elsewhere(pool):
    ok0, _ = (res := hosts_pool(pool, ("a", "b"), **LONG_SPIN).run(cases.busy_receiver, 0.3, timeout=100))[0]
    ok1, d = res[1]
    assert ok0 and ok1
    # Rank 1's caller took its sockets; once it was busy elsewhere the progress thread took them
    # back and read the message, so the receive found it in the ring.
    assert d["caller_takes"] >= 1 and d["reclaims"] >= 1, d
    assert d["frames_read_by_caller"] == 0, d


@pytest.mark.timeout(120)
@pytest.mark.parametrize("chunk", [4096, 524288], ids=["4k-chunks", "512k-chunks"])
def test_mixed_sizes_queued_behind_a_busy_receiver(pool, chunk):
    # int32 counts: tiny, around the 16 KiB staging buffer (4096 elements), several 4 KiB chunks,
    # a multi-chunk message at both chunk sizes; 40 messages, more than the ring's 4 slots.
    sizes = [1, 2, 1021, 4095, 4096, 4097, 4108, 3, 9000, 70_000, 17, 4096 * 3 + 5] * 3 + [5, 4096, 1, 200_001]
    res = hosts_pool(pool, ("a", "b"), COMMLIB_TCP_CHUNK_BYTES=str(chunk)).run(
        cases.mixed_sizes_queued, sizes, 0.3, timeout=100)
    assert res[1] == []


@pytest.mark.timeout(120)
def test_a_call_on_a_slow_peer_stops_spinning(pool):
    # Rank 0's one call waits 30 ms and 60 ms for its two peers, with the default 1 ms spin: once a
    # spin ran out, the call's later waits sleep at once (csrc/host/executor.h, spin_). Spinning
    # through every wait ran out at least once per gap and took the core from the host's other
    # threads (a training step's all_reduce thread on 1 Gbit/s: docs/transports.md). The next
    # calls spin again (begin_call): their caller takes its sockets back to poll them.
    ok, spins_out, takes_after = hosts_pool(pool, ("a", "b", "c")).run(cases.slow_senders, 0.03, 20, timeout=100)[0]
    assert ok
    assert spins_out <= 1
    assert takes_after >= 1
