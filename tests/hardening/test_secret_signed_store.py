"""COMMLIB_SECRET: with it set, every value commlib writes to a store is signed, and unsigned or
badly signed values are refused with a clear error, so a store others can reach cannot steer the job."""
import hashlib
import hmac
import json

import numpy as np
import pytest

import commlib
from commlib.bootstrap.secret import SignedStore, derive_key, handshake_key, load_secret, sign_value, verify_value
from commlib.bootstrap.store import StoreServer, TCPStore
from hardening_util import run_ranks

SECRET = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def server():
    s = StoreServer("127.0.0.1", 0)
    yield s
    s.close()


def test_key_derivation_is_the_documented_one():
    """docs/security.md: key(purpose) = HMAC-SHA256(secret, "commlib/v1/" + purpose)."""
    s = SECRET.encode()
    assert derive_key(s, "store") == hmac.new(s, b"commlib/v1/store", hashlib.sha256).digest()
    assert derive_key(s, "store") != derive_key(s, "tcp-handshake")
    with pytest.raises(ValueError, match="COMMLIB_SECRET"):
        load_secret({"COMMLIB_SECRET": "short"})
    assert load_secret({}) is None
    assert handshake_key({"COMMLIB_SECRET": SECRET}) == derive_key(s, "tcp-handshake")
    assert handshake_key({}) is None


def test_signatures_bind_key_name_and_secret():
    k = derive_key(SECRET.encode(), "store")
    signed = sign_value(k, b"a/shm", b"value")
    assert verify_value(k, b"a/shm", signed) == b"value"
    with pytest.raises(commlib.RendezvousError, match="bad signature"):
        verify_value(k, b"b/shm", signed)  # replayed under another key
    with pytest.raises(commlib.RendezvousError, match="bad signature"):
        verify_value(derive_key(b"another secret, long enough", "store"), b"a/shm", signed)
    with pytest.raises(commlib.RendezvousError, match="not signed"):
        verify_value(k, b"a/shm", b"value")


def test_rendezvous_with_secret_signs_every_value(server, monkeypatch):
    monkeypatch.setenv("COMMLIB_SECRET", SECRET)

    def rank(r):
        comm = commlib.init(rank=r, world_size=2, store=TCPStore("127.0.0.1", server.port), prefix="sig",
                            timeout=10)
        x = np.full(4, r + 1, np.int32)
        comm.all_reduce(x)
        sub = comm.split(0)
        sub.close()
        comm.close()
        return x.tolist()

    assert run_ranks(rank, 2) == [[3] * 4] * 2
    raw = TCPStore("127.0.0.1", server.port)
    for key in ("sig/shm", "sig/mapped/1", "sig/ready", "sig/split1/in/0", "sig/split1/c0/shm"):
        assert raw.get(key).startswith(b"CLS1"), key
    assert json.loads(SignedStore(raw, derive_key(SECRET.encode(), "store")).get("sig/shm"))["size"] == 2


def test_forged_unsigned_record_is_refused(server, monkeypatch):
    monkeypatch.setenv("COMMLIB_SECRET", SECRET)
    TCPStore("127.0.0.1", server.port).set("forged/host/0", "2:h")  # read first (commlib.bootstrap.hosts)
    TCPStore("127.0.0.1", server.port).set("forged/shm", json.dumps(
        {"pid": 1, "size": 2, "host": "h", "socket": "x", "bytes": 1}))
    with pytest.raises(commlib.RendezvousError, match="not signed"):
        commlib.init(rank=1, world_size=2, store=TCPStore("127.0.0.1", server.port), prefix="forged", timeout=5)
