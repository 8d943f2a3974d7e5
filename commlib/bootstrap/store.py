"""A small TCP key-value store for rendezvous when torch is not in use.

It speaks the subset of torch.distributed.Store that commlib needs (``set``, blocking ``get``,
``add``, ``check``, ``wait``), so either store works wherever commlib takes one. The server
(commlib/bootstrap/store_server.py) is one event-loop thread in one process (rank 0, or a test harness);
clients keep one connection each.

Hardening (docs/security.md): the server binds only the address it is given, accounts what
unproven connections make it hold as bytes arrive, and with ``COMMLIB_SECRET`` stores only signed
values. A client first checks that it talks to a commlib store (a hello exchange), and every
operation it makes has a socket timeout: a silent, dead or foreign server gives
``RendezvousError`` naming the address, never a hang.
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from datetime import timedelta

from commlib.errors import RendezvousError
from commlib.bootstrap.store_server import StoreServer
from commlib.bootstrap.store_wire import (ADD as _ADD, CHECK as _CHECK, GET as _GET, HELLO as _HELLO,
                                          HELLO_REPLY as _HELLO_REPLY, MAX_FRAME, MAX_GET_WAIT_S, REFUSED as _REFUSED,
                                          SET as _SET, Malformed as _Malformed, frames)

__all__ = ["StoreServer", "TCPStore", "MAX_FRAME"]


def _send(sock, *parts: bytes):
    sock.sendall(frames(*parts))


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("store connection closed")
        buf += chunk
    return bytes(buf)


def _recv(sock, limit=MAX_FRAME + 1):
    (n,) = struct.unpack("!I", _recv_exact(sock, 4))
    if n > limit:  # refuse before reading: a frame may announce gigabytes
        raise _Malformed(f"frame of {n} bytes exceeds the {limit}-byte limit")
    return _recv_exact(sock, n)


class TCPStore:
    """Client of a StoreServer, with torch.distributed.Store's method names.

    ``timeout`` (seconds) bounds every operation: a blocking ``get`` waits that long for its key,
    and any answer later than that (a silent server) raises RendezvousError. ``connect_timeout``
    bounds the wait for the server to accept (rank 0 may start last).
    """

    def __init__(self, host: str, port: int, timeout: float = 300.0, connect_timeout: float = 60.0):
        self.timeout = float(timeout)
        self._where = f"{host}:{port}"
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=min(5.0, connect_timeout))
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise RendezvousError(f"store at {self._where}: cannot connect within "
                                          f"{connect_timeout:g} s ({e})") from None
                time.sleep(0.05)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()
        try:
            with self._lock:
                reply = self._exchange("hello", b"", self.timeout, bytes([_HELLO]))
        except BaseException:
            self._sock.close()
            raise
        if reply != _HELLO_REPLY:
            self._sock.close()
            raise RendezvousError(f"store at {self._where}: answered {reply[:32]!r}, expected a commlib "
                                  "store's hello (is MASTER_PORT used by another program?)")

    @staticmethod
    def _b(x):
        return x.encode() if isinstance(x, str) else bytes(x)

    def _exchange(self, what: str, key, wait: float, *parts: bytes) -> bytes:
        """Send one request, return the reply frame within ``wait`` seconds; every failure is a
        RendezvousError."""
        self._sock.settimeout(wait)
        try:
            _send(self._sock, *parts)
            return _recv(self._sock)
        except socket.timeout:
            raise RendezvousError(f"store at {self._where}: no answer to {what} {key!r} within "
                                  f"{wait:g} s (COMMLIB_TIMEOUT); expected a commlib store") from None
        except _Malformed as e:
            raise RendezvousError(f"store at {self._where}: answered {what} {key!r} with a malformed "
                                  f"frame ({e}); expected a commlib store") from None
        except (ConnectionError, OSError, struct.error) as e:
            raise RendezvousError(f"store at {self._where}: connection lost during {what} {key!r} "
                                  f"({e}); expected a commlib store") from None

    def _refused(self, what: str, key, reply: bytes):
        if reply.startswith(_REFUSED):
            raise RendezvousError(f"store at {self._where}: refused {what} {key!r}: "
                                  f"{reply[len(_REFUSED):][:500].decode(errors='replace')}")

    def set(self, key, value):
        with self._lock:
            reply = self._exchange("set", key, self.timeout, bytes([_SET]), self._b(key), self._b(value))
        self._refused("set", key, reply)

    def get(self, key) -> bytes:
        deadline = time.monotonic() + self.timeout
        while True:
            # The server waits at most MAX_GET_WAIT_S per GET: a longer wait asks again.
            wait = max(0.0, min(deadline - time.monotonic(), MAX_GET_WAIT_S))
            with self._lock:
                # The server answers by then; allow 2 s more for the round trip.
                reply = self._exchange("get", key, wait + 2.0, bytes([_GET]), self._b(key), struct.pack("!d", wait))
            if reply != b"\x00" or time.monotonic() >= deadline:
                break
        if reply[:1] == b"\x00" and len(reply) == 1:
            raise RendezvousError(f"store at {self._where}: key {self._b(key).decode(errors='replace')!r} "
                                  f"not set within {self.timeout:g} s")
        if reply[:1] != b"\x01":
            raise RendezvousError(f"store at {self._where}: malformed answer to get {key!r}")
        return reply[1:]

    def add(self, key, delta: int) -> int:
        with self._lock:
            reply = self._exchange("add", key, self.timeout, bytes([_ADD]), self._b(key),
                                   struct.pack("!q", int(delta)))
        self._refused("add", key, reply)
        if len(reply) != 8:
            raise RendezvousError(f"store at {self._where}: malformed answer to add {key!r}")
        return struct.unpack("!q", reply)[0]

    def check(self, keys) -> bool:
        with self._lock:
            for k in keys:
                if self._exchange("check", k, self.timeout, bytes([_CHECK]), self._b(k)) != b"\x01":
                    return False
        return True

    def wait(self, keys, timeout=None):
        for k in keys:
            self.get(k)

    def set_timeout(self, timeout):
        self.timeout = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)

    def close(self):
        """Close the connection to the server (idempotent); later operations raise
        RendezvousError. Without it the socket lives until garbage collection."""
        try:
            self._sock.close()
        except OSError:
            pass
