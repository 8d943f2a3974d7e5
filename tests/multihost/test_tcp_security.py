"""The TCP link's handshake: HMAC-SHA256 matches Python's, a wrong COMMLIB_SECRET is refused with
a clear error, a right one connects, and random or truncated frames thrown at a live rank's port
are dropped without disturbing the job."""
import hashlib
import hmac
import os
import random

import pytest

import multihost_cases as cases
from commlib import _C, bootstrap
from ranks import RankFailure, RankPool

LOOPBACK = {"COMMLIB_SOCKET_IFNAME": "lo"}
TWO_HOSTS = ("a", "a", "b")


def test_hmac_sha256_matches_python():
    rng = random.Random(7)
    for key_len in (0, 1, 32, 64, 65, 200):
        for msg_len in (0, 1, 55, 56, 63, 64, 65, 1000):
            key = bytes(rng.getrandbits(8) for _ in range(key_len))
            msg = bytes(rng.getrandbits(8) for _ in range(msg_len))
            assert _C.hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest(), (key_len, msg_len)


@pytest.mark.timeout(120)
def test_same_secret_connects_and_wrong_secret_is_refused():
    good = RankPool(3, timeout=60, env={**LOOPBACK, "COMMLIB_HOST_ID": TWO_HOSTS, "COMMLIB_SECRET": "s3cret"})
    try:
        assert good.run(cases.still_works) == [True] * 3
    finally:
        good.close()
    # The refused rank fails at once; the others give up waiting for it after COMMLIB_TIMEOUT.
    fast = {**LOOPBACK, "COMMLIB_HOST_ID": TWO_HOSTS, "COMMLIB_TIMEOUT": "3"}
    with pytest.raises(RankFailure) as info:
        RankPool(3, timeout=60, env={**fast, "COMMLIB_SECRET": ("s3cret", "s3cret", "other")})
    assert "COMMLIB_SECRET" in str(info.value), str(info.value)[-2000:]
    # One side without a secret is refused too (an empty key is a different key).
    with pytest.raises(RankFailure) as info:
        RankPool(3, timeout=60, env={**fast, "COMMLIB_SECRET": ("", "", "x")})
    assert "COMMLIB_SECRET" in str(info.value), str(info.value)[-2000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("secret", ["", "k"], ids=["no-secret", "secret"])
def test_fuzzed_port_does_not_disturb_the_job(pool, secret):
    p = pool(3, env={**LOOPBACK, "COMMLIB_HOST_ID": TWO_HOSTS, "COMMLIB_SECRET": secret})
    addresses = p.run(cases.tcp_port)
    before = p.run(cases.rejected)
    opened = cases.fuzz_port(addresses[0], seed=len(secret), connections=60)
    assert opened == 60
    assert p.run(cases.still_works) == [True] * 3
    # Every foreign connection was counted as refused (the ones that sent nothing too).
    import time
    deadline = time.monotonic() + 10
    while p.run(cases.rejected)[0] - before[0] < opened and time.monotonic() < deadline:
        time.sleep(0.2)
    assert p.run(cases.rejected)[0] - before[0] == opened


def test_unauthenticated_links_are_noted(monkeypatch):
    topo = bootstrap.Topology(["a", "b"], [0, 1])
    monkeypatch.delenv("COMMLIB_SECRET", raising=False)
    assert "unauthenticated" in bootstrap.unauthenticated_note(topo)
    monkeypatch.setenv("COMMLIB_SECRET", "x")
    assert bootstrap.unauthenticated_note(topo) is None
    assert bootstrap.unauthenticated_note(bootstrap.Topology(["a"], [0, 0])) is None


def test_host_id_is_checked(monkeypatch):
    monkeypatch.setenv("COMMLIB_HOST_ID", "a/../b")
    with pytest.raises(ValueError, match="COMMLIB_HOST_ID"):
        bootstrap.host_id()
    monkeypatch.setenv("COMMLIB_HOST_ID", "node-7")
    assert bootstrap.host_id() == "node-7"
