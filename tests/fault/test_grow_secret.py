"""Only the job's processes can join (issue #40, item 2): with COMMLIB_SECRET, a joiner proves the
secret by accepting, signed, a nonce the members drew for its request; an outsider's forged and
replayed join requests are passed over and neither admitted nor able to stop the grow.

The store here does not hold the key (as torchrun's agent store does not): an outsider can write
any key, and only the signatures protect the job. (A commlib store with the secret refuses unsigned
writes outright: tests/hardening/test_secret_signed_store.py.)"""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import grow_cases as gc  # noqa: E402
from commlib.bootstrap.secret import derive_key, sign_value, verify_value  # noqa: E402
from commlib.bootstrap.store import TCPStore  # noqa: E402
from commlib.testing import JoinablePool  # noqa: E402

SECRET = "grow-secret-" + "s" * 20
KEY = derive_key(SECRET.encode(), "store")


def _request(pid: int) -> bytes:
    import commlib
    from commlib.core.grow import identity
    return json.dumps(dict(identity(), pid=pid, id="outsider", version=commlib.__version__)).encode()


def _read(outsider: TCPStore, key: str) -> dict:
    return json.loads(verify_value(KEY, key.encode(), bytes(outsider.get(key))).decode())


@pytest.mark.timeout(120)
def test_forged_and_replayed_join_requests_are_passed_over_under_commlib_secret():
    secret = {"COMMLIB_SECRET": SECRET}
    pool = JoinablePool(2, timeout=60, env=secret)
    outsider = TCPStore("127.0.0.1", pool.store.port)  # no secret: it writes raw values
    grown = []

    def grow_with_a_joiner():
        joiner = pool.joiner(gc.joiner_checks_in, env=secret)
        grown.append(pool.run(gc.case_grow_and_check_in))
        assert joiner.result(30) == 3

    try:
        # forged requests in the first two slots: unsigned, and signed with another secret
        outsider.set("pool/join/req/1", _request(os.getpid()))
        other = derive_key(b"another-secret-" + b"x" * 20, "store")
        outsider.set("pool/join/req/2", sign_value(other, b"pool/join/req/2", _request(os.getpid())))
        grow_with_a_joiner()  # the real joiner took slot 3
        grow_with_a_joiner()  # slot 4
        assert _read(outsider, "pool/join/cursor") == {"next": 5}
        # replay: roll the cursor back to slot 4, whose request and accept (a past joiner's, signed
        # with the secret) are still there; only the nonce tells them from a live joiner's
        outsider.set("pool/join/cursor", sign_value(KEY, b"pool/join/cursor", b'{"next": 4}'))
        grow_with_a_joiner()  # slot 5
        skipped = [_read(outsider, f"pool/join/ans/{i}") for i in (1, 2)]
        offers = [_read(outsider, f"pool/join/ans/{i}") for i in (3, 4, 5)]
        replayed_accept = _read(outsider, "pool/join/acc/4")
        cursor = _read(outsider, "pool/join/cursor")
    finally:
        outsider.close()
        pool.kill()
    for answer in skipped:  # no offer, so nothing to accept
        assert set(answer) == {"skip"}, answer
    # slot 4's old request was offered again by the third grow, but its accept names grow 2's nonce
    assert [o["grow"] for o in offers] == ["pool/grow1", "pool/grow3", "pool/grow3"], offers
    assert replayed_accept["id"] == offers[1]["id"] and replayed_accept["nonce"] != offers[1]["nonce"]
    assert cursor == {"next": 6}
    for g in grown:  # each grow admitted exactly its live joiner: size 3, ranks 0+1+2
        assert [r[:2] for r in g] == [(3, 3), (3, 3)], g
