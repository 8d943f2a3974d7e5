"""The TCP link's handshake: HMAC-SHA256 matches Python's, the handshake key is the one
commlib.bootstrap.secret derives, a wrong COMMLIB_SECRET is refused with a clear error, a right one connects,
and random or truncated frames thrown at a live rank's port are dropped without disturbing the job."""
import hashlib
import hmac
import os
import random
import socket
import struct
import sys
import threading
import time

import pytest

# The emulated-hosts cases shared with tests/multihost (a whole matrix, the listener probes).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "multihost"))
import multihost_cases as cases  # noqa: E402
import commlib._C as _C
from commlib.bootstrap import hosts as bootstrap
from commlib.bootstrap import secret
from commlib.testing import RankFailure, RankPool

LOOPBACK = {"COMMLIB_SOCKET_IFNAME": "lo"}
TWO_HOSTS = ("a", "a", "b")
SECRET = "0123456789abcdef-job-secret"
from tcp_wire import CHALLENGE, MAGIC, VERDICT, hello  # noqa: E402  (tcp_socket.h's frames)


def test_hmac_sha256_matches_python():
    rng = random.Random(7)
    for key_len in (0, 1, 32, 64, 65, 200):
        for msg_len in (0, 1, 55, 56, 63, 64, 65, 1000):
            key = bytes(rng.getrandbits(8) for _ in range(key_len))
            msg = bytes(rng.getrandbits(8) for _ in range(msg_len))
            assert _C.hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest(), (key_len, msg_len)


def _endpoint(monkeypatch, rank, key):
    monkeypatch.setenv("COMMLIB_SOCKET_IFNAME", "lo")
    monkeypatch.delenv("COMMLIB_TCP_NCONNS", raising=False)  # the impostor speaks for one lane
    if key:
        monkeypatch.setenv("COMMLIB_SECRET", key)
    else:
        monkeypatch.delenv("COMMLIB_SECRET", raising=False)
    return _C.TcpEndpoint(rank, 2, "job-1/x", [rank == 1, rank == 0], 3.0)


def _impostor(address, key: bytes, comm_id="job-1/x", chunk=512 << 10, lane=0, lanes=1):
    """Speaks the handshake from Python as rank 1 of 2 (connection `lane` of `lanes`); returns
    (whether the rank's own proof checked out, the verdict: 1 accepted), or None when refused."""
    host, port = address.rsplit(":", 1)
    nonce = os.urandom(32)
    cid = hashlib.sha256(comm_id.encode()).digest()[:16]
    frame = hello(cid, os.getpid(), chunk, nonce, lane, lanes)
    with socket.create_connection((host, int(port)), timeout=3) as s:
        s.sendall(frame)
        raw = s.recv(CHALLENGE.size, socket.MSG_WAITALL)
        if len(raw) != CHALLENGE.size:
            return None
        _, _, _, nonce_s, mac_s = CHALLENGE.unpack(raw)
        fields = cid + struct.pack("<IIII", 1, 0, lane, lanes) + nonce + nonce_s
        accept_ok = hmac.compare_digest(mac_s, hmac.new(key, b"commlib accept" + fields, hashlib.sha256).digest())
        s.sendall(hmac.new(key, b"commlib connect" + fields, hashlib.sha256).digest())
        raw = s.recv(VERDICT.size, socket.MSG_WAITALL)
        return (accept_ok, VERDICT.unpack(raw)[1] if len(raw) == VERDICT.size else None)


def test_handshake_key_is_commlib_secret_derivation(monkeypatch):
    """A Python client holding secret.derive_key(secret, "tcp-handshake") is accepted (and checks
    the rank's own proof); one holding another key is refused and counted."""
    key = secret.derive_key(SECRET.encode(), "tcp-handshake")
    rank0 = _endpoint(monkeypatch, 0, SECRET)
    assert rank0.authenticated
    assert _impostor(rank0.address, os.urandom(32)) == (False, 0)
    assert rank0.rejected == 1
    assert _impostor(rank0.address, key) == (True, 1)
    assert rank0.rejected == 1
    # Without a secret the key is empty: both sides still run the exchange.
    plain = _endpoint(monkeypatch, 0, "")
    assert not plain.authenticated and _impostor(plain.address, b"") == (True, 1)


def test_wrong_secret_is_refused_between_ranks(monkeypatch):
    rank0 = _endpoint(monkeypatch, 0, SECRET)
    rank1 = _endpoint(monkeypatch, 1, "another-secret-of-16+bytes")
    errors = []
    t = threading.Thread(target=lambda: _capture(errors, rank0.connect, ["", rank1.address]))
    t.start()
    with pytest.raises(_C.PeerError, match="COMMLIB_SECRET"):
        rank1.connect([rank0.address, ""])
    t.join()
    assert errors and "did not connect" in errors[0], errors


def _capture(errors, fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - inspected by the test
        errors.append(str(e))


@pytest.mark.timeout(120)
def test_same_secret_connects_and_a_wrong_one_fails_rendezvous():
    good = RankPool(3, timeout=60, env={**LOOPBACK, "COMMLIB_HOST_ID": TWO_HOSTS, "COMMLIB_SECRET": SECRET})
    try:
        assert good.run(cases.still_works) == [True] * 3
    finally:
        good.close()
    fast = {**LOOPBACK, "COMMLIB_HOST_ID": TWO_HOSTS, "COMMLIB_TIMEOUT": "3"}
    with pytest.raises(RankFailure) as info:
        RankPool(3, timeout=60, env={**fast, "COMMLIB_SECRET": (SECRET, SECRET, SECRET + "x")})
    assert "COMMLIB_SECRET" in str(info.value), str(info.value)[-2000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("key", ["", SECRET], ids=["no-secret", "secret"])
def test_fuzzed_port_does_not_disturb_the_job(pool, key):
    p = pool(3, env={**LOOPBACK, "COMMLIB_HOST_ID": TWO_HOSTS, "COMMLIB_SECRET": key})
    addresses = p.run(cases.tcp_port)
    before = p.run(cases.rejected)
    opened = cases.fuzz_port(addresses[0], seed=len(key), connections=60)
    assert opened == 60
    assert p.run(cases.still_works) == [True] * 3
    # Every foreign connection was counted as refused (the ones that sent nothing too).
    deadline = time.monotonic() + 10
    while p.run(cases.rejected)[0] - before[0] < opened and time.monotonic() < deadline:
        time.sleep(0.2)
    assert p.run(cases.rejected)[0] - before[0] == opened


def test_unauthenticated_links_are_noted(monkeypatch):
    topo = bootstrap.Topology(["a", "b"], [0, 1])
    monkeypatch.delenv("COMMLIB_SECRET", raising=False)
    assert "unauthenticated" in bootstrap.unauthenticated_note(topo)
    monkeypatch.setenv("COMMLIB_SECRET", SECRET)
    assert bootstrap.unauthenticated_note(topo) is None
    assert bootstrap.unauthenticated_note(bootstrap.Topology(["a"], [0, 0])) is None


def test_host_id_is_checked(monkeypatch):
    monkeypatch.setenv("COMMLIB_HOST_ID", "a/../b")
    with pytest.raises(ValueError, match="COMMLIB_HOST_ID"):
        bootstrap.host_id()
    monkeypatch.setenv("COMMLIB_HOST_ID", "node-7")
    assert bootstrap.host_id() == "node-7"
