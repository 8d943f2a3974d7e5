"""The stream engine's set-up over commlib's own store from C++, without the GIL (issue #44;
csrc/bindings/commlib_setup_store.h over csrc/bootstrap/store_client.h): no call on the Python store
object once the route read it, signed or not, and no connection of the set-up's left open; and a store server killed during a set-up raises the
StoreLostError the Python store raised. Rank side: commlib_store_setup_cases.py."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

import commlib
import commlib_store_setup_cases as cases
from commlib.bootstrap.secret import SignedStore, derive_key
from commlib.bootstrap.store import TCPStore
from commlib.testing.ranks import RankPool, _start_context, _worker

SECRET = "0123456789abcdef0123456789abcdef"
EMULATED = {"COMMLIB_EMULATED_DELAY_US": "20"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size,signed", [(2, False), (3, False), (2, True)], ids=["2", "3", "2-signed"])
def test_a_set_up_over_commlibs_store_calls_no_python_store_method(pool, size, signed):
    env = dict(EMULATED, **({"COMMLIB_SECRET": SECRET} if signed else {}))
    ranks = pool(size, env=env)
    try:
        results = ranks.run(cases.set_up_sees_no_python_store_call, timeout=150)
        # The set-ups' own connections are closed once they are over (SetupStore::idle): the server
        # (this process's) holds each rank's Python store's connection alone.
        connections = ranks.store.connections
    finally:
        ranks.run(cases.close_kept, timeout=60)
    for rank, (cls, seen, ops, python_store, right) in enumerate(results):
        assert cls == ("SignedStore" if signed else "TCPStore"), (rank, cls)
        assert seen == [] and ops == 0 and python_store is False, (rank, seen, ops, python_store)
        assert right, rank
    assert connections == size, connections


@pytest.mark.timeout(120)
def test_a_set_up_meets_its_peers_while_another_thread_holds_the_gil(pool):
    """No GIL in a set-up over commlib's store: rank 0 meets rank 1 while a thread of rank 0 holds
    the GIL for 8 s; over the store's Python object rank 1 would wait those 8 s for rank 0's link
    setting. (A bound far from both: a loaded machine's set-up takes well under a second.)"""
    held, took = pool(2, env=EMULATED).run(cases.set_up_while_a_thread_holds_the_gil, 8, timeout=90)
    assert held >= 7.9 and took < 4.0, (held, took)


@pytest.mark.timeout(120)
def test_a_forged_handle_is_refused_in_a_set_up_as_the_python_store_refuses_it(pool):
    cls, message, key = pool(2, env=dict(EMULATED, COMMLIB_SECRET=SECRET)).run(
        cases.set_up_meets_a_tampered_handle, timeout=90)[0]

    class Planted:  # the value rank 1 planted, read back through the Python SignedStore
        def get(self, name):
            return cases.FORGED
    with pytest.raises(commlib.RendezvousError) as python:
        SignedStore(Planted(), derive_key(SECRET.encode(), "store")).get(key)
    assert (cls, message) == ("RendezvousError", str(python.value)), (cls, message)
    assert "bad signature" in message, message


class _PoolOverAStoreProcess(RankPool):
    """A pool whose store is served by a `commlib store` process (so the test can SIGKILL it)."""

    def _start_ranks(self):
        self.server = subprocess.Popen([sys.executable, "-m", "commlib", "store", "--port", "0"],
                                       stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        line = self.server.stdout.readline()
        self.port = int(re.search(r"127\.0\.0\.1:(\d+)", line).group(1))
        ctx = _start_context(self.env)
        for r in range(self.size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(r, self.size, self.port, child, self.env, dict(os.environ)),
                            daemon=True)
            p.start()
            self.conns.append(parent)
            self.procs.append(p)

    def kill(self):
        super().kill()
        if getattr(self, "server", None) is not None and self.server.poll() is None:
            self.server.kill()
        if getattr(self, "server", None) is not None:
            self.server.wait(10)
            self.server.stdout.close()


@pytest.mark.timeout(120)
def test_a_store_server_killed_during_a_set_up_is_the_same_store_lost_error():
    pool = _PoolOverAStoreProcess(2, timeout=90, env=dict(EMULATED, COMMLIB_TIMEOUT="60"))
    killed = threading.Event()

    def kill_when_rank0_waits():  # rank 0 published its handle: it is in the set-up's wait
        probe = TCPStore("127.0.0.1", pool.port, timeout=30)
        try:
            deadline = time.monotonic() + 60
            while not probe.check(["pool/device1/0"]) and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.2)
        finally:
            probe.close()
        pool.server.send_signal(signal.SIGKILL)
        killed.set()
    t = threading.Thread(target=kill_when_rank0_waits, daemon=True)
    t.start()
    try:
        (cls, message), _ = pool.run(cases.set_up_while_the_store_dies, timeout=90)
    finally:
        t.join(70)
        pool.kill()
    assert killed.is_set()
    # The Python store's own text (store.py TCPStore._exchange), for the poll of rank 1's handle or
    # of the error key, whichever the kill met.
    assert cls == "StoreLostError", (cls, message)
    assert re.fullmatch(
        rf"store at 127\.0\.0\.1:{pool.port}: connection lost during check 'pool/device1/(1|error)' "
        r"\((store connection closed|\[Errno 104\] Connection reset by peer)\): the server closed it "
        r"\(it stopped, or is not a commlib store\)", message), message
