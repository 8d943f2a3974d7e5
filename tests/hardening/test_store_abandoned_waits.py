"""Issue #35 item 1: what abandoned blocking GETs leave in the store server.

Before: a client that sent a GET of a missing key with a long timeout, then a few MiB more, and
closed, left the server holding its connection in the deadline heap (with its input buffer) until
the GET's deadline, its key in the waiters' map for good, and the server kept reading into a
waiting connection's buffer; repeated, rank 0 grew by what each client sent. Now a dropped
connection releases everything at once, a waiting connection reads nothing (input or hang-up ends
it), a GET waits at most MAX_GET_WAIT_S, and waiting keys count against MAX_IN_FLIGHT_BYTES.
The counts come from ``StoreServer.held()`` (what the server still references), not from RSS.
"""
import socket
import struct
import threading
import time

import numpy as np
import pytest

from commlib.bootstrap import store as store_client
from commlib.bootstrap import store_server
from commlib.bootstrap.store import StoreServer, TCPStore
from commlib.bootstrap.store_wire import GET, HELLO, frames

ABANDONED = 1000
EXTRA = 4 << 20              # what each abandoning client tries to send behind its GET
ATTACKERS = 4                # threads, each with its own connections


def _get_frame(key: bytes, timeout: float = 1e7) -> bytes:
    return frames(bytes([GET]), key, struct.pack("!d", timeout))


def _abandon(port: int, first: int, n: int):
    """``n`` clients that each GET a missing key for as long as the protocol allows, then (three in
    four) push 4 MiB more, and close."""
    junk = memoryview(bytes(EXTRA))
    for i in range(first, first + n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            if i % 2:
                s.sendall(frames(bytes([HELLO])))  # a client that completed a request first
                s.recv(64)
            s.sendall(_get_frame(f"missing/{i}".encode()))
            if i % 4:
                s.sendall(junk)  # the server ends the connection at its first byte
        except OSError:  # reset or closed by the server: what it should do
            pass
        finally:
            s.close()


def _settled(server, want: dict, within: float = 20.0) -> dict:
    """``server.held()`` once it matches ``want`` (the server notices closes in its own time),
    or as it is when ``within`` seconds have passed."""
    deadline = time.monotonic() + within
    while True:
        held = server.held()
        if all(held[k] == v for k, v in want.items()) or time.monotonic() > deadline:
            return held
        time.sleep(0.02)


def job_round(comm, n):
    """Store traffic and collectives: a split (a rendezvous through the store) and an all_reduce."""
    sub = comm.split(0, key=comm.rank)
    try:
        x = np.full(256, comm.rank + n, np.int64)
        sub.all_reduce(x)
        return int(x[0])
    finally:
        sub.close()


@pytest.mark.timeout(120)
def test_abandoned_waits_leave_nothing_while_a_job_runs(pool):
    ranks = pool(2)
    server = ranks.store
    per = ABANDONED // ATTACKERS
    attackers = [threading.Thread(target=_abandon, args=(server.port, a * per, per), daemon=True)
                 for a in range(ATTACKERS)]
    for t in attackers:
        t.start()
    rounds = 0
    while rounds == 0 or any(t.is_alive() for t in attackers):  # the job runs throughout
        assert ranks.run(job_round, rounds, timeout=60) == [1 + 2 * rounds] * 2
        rounds += 1
    for t in attackers:
        t.join(60)
        assert not t.is_alive()
    idle = {"connections": ranks.size, "waiting": 0, "waiter_keys": 0, "deadlines": 0,
            "accounted_bytes": 0, "buffered_bytes": 0}
    held = _settled(server, idle)
    print(f"{ABANDONED} abandoned waits beside {rounds} job rounds: server holds {held}")
    assert held == idle
    assert ranks.run(job_round, 0, timeout=60) == [1, 1]


@pytest.fixture
def server():
    s = StoreServer("127.0.0.1", 0)
    yield s
    s.close()


def _closed_by_server(sock) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_input_behind_a_waiting_get_ends_the_connection(server):
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(_get_frame(b"missing"))
    assert _settled(server, {"waiting": 1})["waiting"] == 1
    s.sendall(b"\0")
    assert _closed_by_server(s)
    s.close()
    assert _settled(server, {"connections": 0, "deadlines": 0}) == {
        "connections": 0, "waiting": 0, "waiter_keys": 0, "deadlines": 0, "accounted_bytes": 0,
        "buffered_bytes": 0}


def test_get_wait_is_capped_and_the_client_asks_again(server, monkeypatch):
    monkeypatch.setattr(store_server, "MAX_GET_WAIT_S", 0.2)
    monkeypatch.setattr(store_client, "MAX_GET_WAIT_S", 0.2)
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(_get_frame(b"missing"))  # asks for 1e7 s: answered "not set" at the cap
    want = frames(b"\x00")
    got = b""
    while len(got) < len(want):  # the length prefix and the body may come in two segments
        chunk = s.recv(len(want) - len(got))
        assert chunk, f"closed after {got!r}"
        got += chunk
    assert got == want
    s.close()
    reader, writer = TCPStore("127.0.0.1", server.port, timeout=30), TCPStore("127.0.0.1", server.port)
    setter = threading.Timer(1.0, writer.set, ("late", b"v"))  # after several capped rounds
    setter.start()
    try:
        assert reader.get("late") == b"v"
    finally:
        setter.join()
        reader.close()
        writer.close()


def test_waiting_keys_count_against_the_in_flight_budget(server):
    """Waiting GETs of 4 MiB keys fill the 32 MiB budget: the server closes the biggest holders,
    never a working client's small wait."""
    small = TCPStore("127.0.0.1", server.port, timeout=30)
    got = []
    waiter = threading.Thread(target=lambda: got.append(small.get("late")))
    waiter.start()
    assert _settled(server, {"waiting": 1})["waiting"] == 1
    big = []
    for i in range(12):  # 48 MiB of keys
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        big.append(s)
        try:
            s.sendall(_get_frame(bytes([i + 1]) * store_server.MAX_FRAME))
        except OSError:  # closed by the server to make room: what it should do
            pass
    held = server.held()
    deadline = time.monotonic() + 20
    while held["waiting"] != held["connections"] and time.monotonic() < deadline:
        time.sleep(0.02)  # until every connection left open is waiting (none part read)
        held = server.held()
    assert held["accounted_bytes"] <= store_server.MAX_IN_FLIGHT_BYTES, held
    assert held["buffered_bytes"] <= store_server.MAX_IN_FLIGHT_BYTES, held
    writer = TCPStore("127.0.0.1", server.port)
    writer.set("late", b"v")
    waiter.join(10)
    assert got == [b"v"]
    for s in big:
        s.close()
    small.close()
    writer.close()
    assert _settled(server, {"connections": 0, "accounted_bytes": 0})["accounted_bytes"] == 0
