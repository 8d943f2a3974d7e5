"""TCP striping: several connections ("lanes", COMMLIB_TCP_NCONNS) per pair of ranks on different
hosts, DATA frame s of a direction on lane s % N. Exact results at chunk counts that split unevenly
over the lanes, every collective x algorithm with 3 lanes, a lane lost mid-transfer, mismatched
lane counts, duplicate and impossible lanes in the handshake, and no descriptor leaks.
Emulated hosts, TCP over loopback."""
import hashlib
import hmac
import os
import socket
import struct
import sys
import threading
import time

import pytest

# The emulated-hosts cases shared with tests/multihost (a whole matrix, the listener probes).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "multihost"))
import multihost_cases as cases  # noqa: E402
import stripe_cases  # noqa: E402
import commlib._C as _C  # noqa: E402
from commlib.testing import RankFailure, RankPool

LOOPBACK = {"COMMLIB_SOCKET_IFNAME": "lo"}
CHUNK = 16 << 10  # small chunks: many per message at small sizes, the rings wrap often


def lanes_pool(pool, hosts, lanes, **extra):
    return pool(len(hosts), env={**LOOPBACK, "COMMLIB_HOST_ID": hosts, "COMMLIB_TCP_NCONNS": str(lanes), **extra})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lanes", [2, 3])
def test_exact_results_at_uneven_chunk_counts(pool, lanes):
    p = lanes_pool(pool, ("a", "b", "c"), lanes, COMMLIB_TCP_CHUNK_BYTES=str(CHUNK))
    for rank, (fails, stats) in enumerate(p.run(stripe_cases.uneven_messages, CHUNK, lanes, timeout=100)):
        assert not fails, f"rank {rank}: {fails[:5]}"
        assert stats["lanes"] == lanes
        assert stats["frames_striped"] > 0  # lanes other than the first carried data
        assert stats["landed"] > 0  # and large receives still land in place


@pytest.mark.timeout(200)
def test_every_collective_and_algorithm_with_three_lanes(pool):
    # A rerun of tests/multihost/test_emulated_hosts.py's matrix under another setting: its covering
    # (every algorithm a small and a large message, dtypes and roots rotating), as the host
    # matrix's reruns do; the full product on this map runs there with one lane, and the lanes'
    # own edges (chunk counts that split unevenly) in test_exact_results_at_uneven_chunk_counts.
    p = lanes_pool(pool, ("a", "a", "b", "b"), 3)
    failures = [f for fails in p.run(cases.matrix, False, timeout=180) for f in fails]
    assert not failures, "\n".join(failures[:20])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("lane", [1, 0], ids=["second-lane", "first-lane"])
def test_lane_lost_mid_transfer_fails_every_rank(pool, lane):
    p = lanes_pool(pool, ("a", "b", "c"), 3)
    timeout_s = 10
    for rank, (msg, took) in enumerate(p.run(stripe_cases.lane_killed_mid_transfer, 2, lane, timeout_s, timeout=90)):
        assert msg is not None and msg.startswith("PeerError"), f"rank {rank}: {msg}"
        assert "rank" in msg and "all_reduce" in msg, msg
        assert took < timeout_s, f"rank {rank} took {took:.1f} s"


def test_no_descriptor_or_thread_leaks(pool):
    res = lanes_pool(pool, ("a", "a", "b", "b"), 3).run(stripe_cases.lanes_after_close)
    for before, after, _ in res:
        assert after == before, f"(fds, threads) before {before}, after {after}"
    assert sum(striped for _, _, striped in res) > 0  # (the ranks that send over TCP)


@pytest.mark.timeout(60)
def test_mismatched_lane_counts_fail_with_the_setting_named():
    env = {**LOOPBACK, "COMMLIB_HOST_ID": ("a", "b"), "COMMLIB_TIMEOUT": "20", "COMMLIB_TCP_NCONNS": ("2", "3")}
    with pytest.raises(RankFailure) as info:
        RankPool(2, timeout=40, env=env)
    # The pool reports the first rank that failed: either side names both values (both sides
    # failing is checked between two endpoints below).
    text = str(info.value)
    assert ("COMMLIB_TCP_NCONNS=3, this rank 2" in text or "COMMLIB_TCP_NCONNS=2, this rank 3" in text), text[-2000:]
    assert "must be the same on every rank" in text


@pytest.mark.timeout(60)
def test_fuzzed_port_does_not_disturb_a_job_with_lanes(pool):
    p = lanes_pool(pool, ("a", "a", "b"), 2)
    addresses = p.run(cases.tcp_port)
    before = p.run(cases.rejected)[0]
    assert cases.fuzz_port(addresses[0], seed=13, connections=24) == 24
    assert p.run(cases.still_works) == [True] * 3
    deadline = time.monotonic() + 10  # every foreign connection is refused and counted
    while p.run(cases.rejected)[0] - before < 24 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert p.run(cases.rejected)[0] - before == 24


# ---- the handshake, between two endpoints in this process (tcp_socket.h) ----

from tcp_wire import CHALLENGE, MAGIC, VERDICT, hello  # noqa: E402


def _endpoint(monkeypatch, rank, lanes):
    monkeypatch.setenv("COMMLIB_SOCKET_IFNAME", "lo")
    monkeypatch.delenv("COMMLIB_SECRET", raising=False)
    monkeypatch.setenv("COMMLIB_TCP_NCONNS", str(lanes))
    return _C.TcpEndpoint(rank, 2, "job-7/x", [rank == 1, rank == 0], 5.0)


def _hello(address, lane, lanes, keep):
    """Rank 1's handshake for connection `lane` of `lanes` (no secret: the empty key). Returns the
    verdict's (accepted, lanes) or None when the rank dropped or refused the connection first. The socket
    stays open in `keep` (a lane that closes would lose the pair)."""
    host, port = address.rsplit(":", 1)
    nonce = os.urandom(32)
    cid = hashlib.sha256(b"job-7/x").digest()[:16]
    s = socket.create_connection((host, int(port)), timeout=10)  # (a loaded machine)
    keep.append(s)
    s.sendall(hello(cid, os.getpid(), 512 << 10, nonce, lane, lanes))
    raw = s.recv(CHALLENGE.size, socket.MSG_WAITALL)
    if len(raw) != CHALLENGE.size or CHALLENGE.unpack(raw)[0] != MAGIC:  # dropped, or refused with a reason
        return None
    nonce_s = CHALLENGE.unpack(raw)[3]
    fields = cid + struct.pack("<IIII", 1, 0, lane, lanes) + nonce + nonce_s
    s.sendall(hmac.new(b"", b"commlib connect" + fields, hashlib.sha256).digest())
    raw = s.recv(VERDICT.size, socket.MSG_WAITALL)
    return VERDICT.unpack(raw)[1:] if len(raw) == VERDICT.size else None


@pytest.mark.timeout(60)
def test_duplicate_and_impossible_lanes_are_refused(monkeypatch):
    """Lanes out of range, lane counts out of range and a lane already connected are refused and
    counted (before the refusal is sent, so the count is exact as soon as it is read); the lanes
    that belong complete the pair. (Its endpoint is destroyed right after a refusal: the crash
    that case once caused is forced in test_tcp_handshake_teardown.py.)"""
    rank0 = _endpoint(monkeypatch, 0, 2)
    keep = []
    try:
        assert _hello(rank0.address, 2, 2, keep) is None  # lane out of range
        assert _hello(rank0.address, 0, 17, keep) is None  # more lanes than allowed
        assert _hello(rank0.address, 0, 2, keep) == (1, 2)
        assert _hello(rank0.address, 0, 2, keep) is None  # lane 0 again
        assert rank0.rejected == 3
        assert _hello(rank0.address, 1, 2, keep) == (1, 2)  # the pair is complete: connect() returns
        rank0.connect(["", "127.0.0.1:1"])
        assert _hello(rank0.address, 1, 2, keep) is None  # nothing more joins a connected pair
        assert rank0.rejected == 4
    finally:
        for s in keep:
            s.close()


def test_lane_count_mismatch_fails_both_endpoints(monkeypatch):
    rank0 = _endpoint(monkeypatch, 0, 2)
    rank1 = _endpoint(monkeypatch, 1, 3)
    errors = []

    def accept():
        try:
            rank0.connect(["", rank1.address])
        except Exception as e:  # noqa: BLE001 - inspected below
            errors.append(f"{type(e).__name__}: {e}")

    t = threading.Thread(target=accept)
    t.start()
    with pytest.raises(_C.PeerError, match="uses COMMLIB_TCP_NCONNS=2, this rank 3"):
        rank1.connect([rank0.address, ""])
    t.join()
    assert errors and "PeerError" in errors[0] and "COMMLIB_TCP_NCONNS=3, this rank 2" in errors[0], errors
