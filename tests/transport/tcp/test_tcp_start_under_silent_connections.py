"""Issue #27 item 2: connections an outsider holds at the ranks' TCP ports cannot stop the job.

Before: 40 silent connections to rank 0's data port, opened as soon as its address was in the
store (signing does not hide it), filled its 16 handshake slots for 10 s each; rank 0 closed new
connections, and the real peer failed at once with a misleading "refused the connection
(different communicator, ...)". Now a connection must send its first bytes within 2 s, a new one
evicts the oldest unproven one instead of being closed, and the connecting rank retries with
back-off until its deadline; a real refusal carries its reason.
"""
import selectors
import socket
import threading
import time

import numpy as np
import pytest

from commlib import _C
from commlib.bootstrap.store import TCPStore
from commlib.testing import RankPool

SECRET = "0123456789abcdef-tcp-start-secret"
HELD = 48  # silent connections kept open at every rank's data port
ENV = {"COMMLIB_SOCKET_IFNAME": "lo", "COMMLIB_HOST_ID": ("a", "a", "b"), "COMMLIB_SECRET": SECRET,
       "COMMLIB_TIMEOUT": "30"}


class _Squatter(threading.Thread):
    """Watches the pool's store for the ranks' TCP addresses and, from the moment each appears,
    keeps ``HELD`` silent connections open to it (reopening any the rank closes)."""

    def __init__(self, store_port: int, size: int):
        super().__init__(daemon=True)
        self.store_port, self.size = store_port, size
        self.stop = threading.Event()
        self.opened = 0
        self.ports_found = 0

    def _open(self, sel, address):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(address)
        sel.register(s, selectors.EVENT_READ, address)
        self.opened += 1

    def run(self):
        store = TCPStore("127.0.0.1", self.store_port, timeout=5)
        sel = selectors.DefaultSelector()
        found = set()
        try:
            while not self.stop.is_set():
                for r in set(range(self.size)) - found:
                    key = f"pool/tcp/{r}"
                    if store.check([key]):
                        raw = store.get(key)
                        value = raw[36:] if raw.startswith(b"CLS1") else raw  # the signature hides nothing
                        host, port = value.decode().rsplit(":", 1)
                        found.add(r)
                        for _ in range(HELD):
                            self._open(sel, (host.strip("[]"), int(port)))
                self.ports_found = len(found)
                for key, _ in sel.select(0.02):  # readable: closed by the rank; open another
                    try:
                        data = key.fileobj.recv(64)
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
                        self._open(sel, key.data)
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()
            sel.close()
            store.close()


class _SquattedPool(RankPool):
    def _start_ranks(self):
        super()._start_ranks()
        self.squatter = _Squatter(self.store.port, self.size)
        self.squatter.start()


def still_works(comm):
    x = np.full(10_000, comm.rank + 1, np.int64)
    comm.all_reduce(x)
    return bool((x == 6).all()), comm._core.tcp_rejected()


@pytest.mark.timeout(120)
def test_job_starts_while_every_data_port_is_squatted():
    t = time.monotonic()
    pool = _SquattedPool(3, timeout=60, env=ENV)
    try:
        started = time.monotonic() - t
        results = pool.run(still_works)
        squatter = pool.squatter
    finally:
        pool.squatter.stop.set()
        pool.close()
        pool.squatter.join(10)
    print(f"started in {started:.1f} s beside {squatter.opened} silent connections; "
          f"rejected per rank {[r for _, r in results]}")
    assert squatter.ports_found == 3
    assert [ok for ok, _ in results] == [True] * 3
    assert squatter.opened >= 3 * HELD
    assert sum(rejected for _, rejected in results) >= HELD, results  # they were there, and dropped
    assert started < 30, started  # within COMMLIB_TIMEOUT


def _endpoint(monkeypatch, rank, chunk=None, timeout=8.0):
    monkeypatch.setenv("COMMLIB_SOCKET_IFNAME", "lo")
    monkeypatch.delenv("COMMLIB_SECRET", raising=False)
    monkeypatch.delenv("COMMLIB_TCP_NCONNS", raising=False)
    if chunk:
        monkeypatch.setenv("COMMLIB_TCP_CHUNK_BYTES", str(chunk))
    else:
        monkeypatch.delenv("COMMLIB_TCP_CHUNK_BYTES", raising=False)
    return _C.TcpEndpoint(rank, 2, "job-27/x", [rank == 1, rank == 0], timeout)


def _connect(endpoint, addresses, errors):
    try:
        endpoint.connect(addresses)
    except Exception as e:  # noqa: BLE001 - inspected by the test
        errors.append(str(e))


def test_a_real_refusal_says_why_at_once(monkeypatch):
    """A Hello the acceptor will not take (here COMMLIB_TCP_CHUNK_BYTES differs) is answered with
    the reason, so the connecting rank fails at once naming it instead of retrying."""
    rank0 = _endpoint(monkeypatch, 0, timeout=2.5)  # then it gives up waiting for rank 1
    rank1 = _endpoint(monkeypatch, 1, chunk=64 << 10)
    errors = []
    t = threading.Thread(target=_connect, args=(rank0, ["", rank1.address], errors))
    t.start()
    start = time.monotonic()
    with pytest.raises(_C.PeerError, match="refused the connection: COMMLIB_TCP_CHUNK_BYTES differs"):
        rank1.connect([rank0.address, ""])
    assert time.monotonic() - start < 2.0
    t.join()
    assert errors and "did not connect" in errors[0], errors


def test_silent_connections_are_evicted_for_a_real_one(monkeypatch):
    """More silent connections than handshake slots, opened first: the real rank still connects,
    and the evicted and timed-out ones are counted as refused."""
    rank0 = _endpoint(monkeypatch, 0)
    rank1 = _endpoint(monkeypatch, 1)
    host, port = rank0.address.rsplit(":", 1)
    silent = [socket.create_connection((host, int(port))) for _ in range(40)]
    try:
        errors = []
        t = threading.Thread(target=_connect, args=(rank0, ["", rank1.address], errors))
        t.start()
        start = time.monotonic()
        rank1.connect([rank0.address, ""])
        t.join()
        assert not errors, errors
        assert time.monotonic() - start < 4.0
        closed = 0
        for s in silent:  # every one is closed: evicted, or after 2 s without a Hello
            s.settimeout(5)
            closed += s.recv(1) == b""
        assert closed == 40 and rank0.rejected == 40
    finally:
        for s in silent:
            s.close()


def test_a_peer_that_keeps_closing_is_retried_then_named(monkeypatch):
    """A port whose owner closes every connection before the challenge (as a rank does when it
    evicts): the connecting rank retries until its deadline, then says what happened."""
    rank1 = _endpoint(monkeypatch, 1, timeout=1.5)
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def close_everything():
        listener.settimeout(0.1)
        while True:
            try:
                s, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # the listener was closed
            accepted.append(1)
            s.close()

    t = threading.Thread(target=close_everything, daemon=True)
    t.start()
    start = time.monotonic()
    try:
        with pytest.raises(_C.PeerError, match=r"could not complete the handshake with rank 0 .* within 1 s "
                                               r"\(COMMLIB_TIMEOUT\): \d+ connection\(s\) were closed"):
            rank1.connect([f"127.0.0.1:{listener.getsockname()[1]}", ""])
    finally:
        listener.close()
        t.join(5)
    assert 1.4 < time.monotonic() - start < 3.0
    assert len(accepted) >= 3  # retried, with back-off (20 ms doubling to 0.5 s)
