"""Row 2: MASTER_PORT held by a foreign process (silent, or answering junk).

Before: rank 0 failed to bind and raised; every other rank hung forever in the store client (no
socket timeout, COMMLIB_TIMEOUT ignored). Now every rank raises RendezvousError naming the address.
"""
import socket
import threading
import time

import pytest

import commlib


def _foreign(reply: bytes):
    """A listening socket that accepts and then stays silent (reply b"") or answers junk."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    conns = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            conns.append(c)
            if reply:
                try:
                    c.recv(64)
                    c.sendall(reply)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return srv, conns


@pytest.mark.parametrize("reply", [b"", b"\x00\x00\x00\x05HTTP/", b"HTTP/1.1 400 Bad Request\r\n\r\n"],
                         ids=["silent", "short-junk", "http"])
def test_every_rank_gets_rendezvous_error_naming_the_address(reply):
    srv, conns = _foreign(reply)
    port = srv.getsockname()[1]
    try:
        t = time.monotonic()
        for rank in (0, 1):
            with pytest.raises(commlib.RendezvousError, match=f"127.0.0.1:{port}"):
                commlib.init(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port, timeout=0.5)
        assert time.monotonic() - t < 15  # bounded by COMMLIB_TIMEOUT (+5 s for the silent case)
    finally:
        srv.close()
        for c in conns:
            c.close()


def test_timeout_comes_from_commlib_timeout(monkeypatch):
    srv, conns = _foreign(b"")
    monkeypatch.setenv("COMMLIB_TIMEOUT", "0.5")
    try:
        with pytest.raises(commlib.RendezvousError, match="expected a commlib store"):
            commlib.init(rank=1, world_size=2, master_addr="127.0.0.1", master_port=srv.getsockname()[1])
    finally:
        srv.close()
        for c in conns:
            c.close()
