"""Row 3: the store server under hostile clients.

Before: one frame announcing 4 GiB grew rank 0 by 1.1 GB; connections and handler threads were
unbounded (291 seen); an empty frame raised in a server thread; rank 0 bound 0.0.0.0. Now frames are
limited before they are read, connections are capped, a malformed frame closes only its connection,
and the server binds the address it is asked for.
"""
import resource
import socket
import struct
import threading

import numpy as np
import pytest

import commlib
from commlib.bootstrap import store_server
from commlib.bootstrap.store import StoreServer, TCPStore


@pytest.fixture
def server():
    s = StoreServer("127.0.0.1", 0)
    yield s
    s.close()


def _closed_by_server(sock) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_huge_frame_is_refused_without_allocating(server):
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    s = socket.create_connection(("127.0.0.1", server.port))
    try:
        s.sendall(struct.pack("!I", 1) + b"\x01" + struct.pack("!I", 0xFFFFFFFF) + b"x" * (1 << 20))
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server closed the connection as soon as it read the announced size
    assert _closed_by_server(s)
    s.close()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 64 << 10  # KiB: < 64 MiB
    c = TCPStore("127.0.0.1", server.port)  # the server goes on serving others
    c.set("k", b"v")
    assert c.get("k") == b"v"


@pytest.mark.parametrize("frame", [struct.pack("!I", 0), struct.pack("!I", 1) + b"\x63",
                                   struct.pack("!I", 1) + b"\x02" + struct.pack("!I", 1) + b"k" +
                                   struct.pack("!I", 3) + b"abc"],
                         ids=["empty", "unknown-command", "bad-timeout"])
def test_malformed_frame_closes_that_connection_only(server, frame):
    errors = []
    old = threading.excepthook
    threading.excepthook = lambda args: errors.append(args)
    try:
        good = TCPStore("127.0.0.1", server.port)
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(frame)
        assert _closed_by_server(s)
        s.close()
        good.set("a", b"1")
        assert good.get("a") == b"1"
    finally:
        threading.excepthook = old
    assert not errors


def test_connections_are_capped(server, monkeypatch):
    monkeypatch.setattr(store_server, "MAX_CONNECTIONS", 8)
    held = [TCPStore("127.0.0.1", server.port) for _ in range(8)]
    extra = socket.create_connection(("127.0.0.1", server.port))
    assert _closed_by_server(extra)
    extra.close()
    held.pop().close()
    for _ in range(50):  # the freed slot is reused once the server has noticed the close
        try:
            TCPStore("127.0.0.1", server.port, timeout=1).close()
            break
        except commlib.RendezvousError:
            pass
    else:
        pytest.fail("a freed connection slot was not reused")
    for h in held:
        h.close()


def test_rank0_binds_only_the_address_asked():
    comm = commlib.init(rank=0, world_size=1, master_addr="127.0.0.2", master_port=0)
    try:
        assert comm._owned[1].address[0] == "127.0.0.2"
        x = np.ones(3, np.int64)
        comm.all_reduce(x)
        assert (x == 1).all()
    finally:
        comm.close()
