"""Two grows of one job at once (issue #40, item 1), at the level of the admission protocol
(commlib/core/admission.py), in one process: two leaders race to offer one joiner's request
and exactly one of them admits it, the one whose nonce the joiner accepted; the other passes the
slot over at once. With COMMLIB_SECRET and without."""
import threading
import time

import pytest

from commlib.bootstrap.secret import secured
from commlib.bootstrap.store import StoreServer, TCPStore
from commlib.core.admission import Asking, Offers
from commlib.errors import RendezvousError

ROUNDS = 20


def _race(store, job):
    """One joiner and two leaders on ``job``: (what each leader took, the joiner's offer)."""
    took, offer = [None, None], {}
    start = threading.Barrier(3)

    def lead(k):
        offers = Offers(store(), job, f"{job}/grow{k}")
        start.wait()
        got = None
        while got is None:
            got = offers.take(lambda: None, lambda req: False)
            time.sleep(0.0005)
        took[k] = got

    def join():
        asking = Asking(store(), job, {"pid": 1, "host": "h", "version": "v", "settings": {}})
        start.wait()
        offer.update(asking.offer(time.monotonic() + 30, lambda: RendezvousError("no offer"))[1])

    threads = [threading.Thread(target=lead, args=(k,)) for k in (0, 1)] + [threading.Thread(target=join)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return took, offer


@pytest.mark.timeout(60)
@pytest.mark.parametrize("secret", [None, "two-grows-" + "k" * 20], ids=["plain", "secret"])
def test_two_grows_at_once_admit_a_joiner_once(monkeypatch, secret):
    if secret:
        monkeypatch.setenv("COMMLIB_SECRET", secret)
    server = StoreServer("127.0.0.1", 0)
    opened = []

    def store():
        s = TCPStore("127.0.0.1", server.port)
        opened.append(s)
        return secured(s)

    try:
        for i in range(ROUNDS):
            took, offer = _race(store, f"job{i}")
            admitted = [k for k in (0, 1) if took[k] is not None and took[k][1]]
            assert len(admitted) == 1, (i, took)
            winner = admitted[0]
            slot, nonce, req = took[winner]
            assert (slot, nonce, offer["grow"]) == (1, offer["nonce"], f"job{i}/grow{winner}"), (i, took, offer)
            assert took[1 - winner] == (1, "", {}), (i, took)  # passed over, not admitted
    finally:
        for s in opened:
            s.close()
        server.close()
