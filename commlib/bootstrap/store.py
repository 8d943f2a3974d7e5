"""A small TCP key-value store for rendezvous when torch is not in use.

It speaks the subset of torch.distributed.Store that commlib needs (``set``, blocking ``get``,
``add``, ``check``, ``wait``), so either store works wherever commlib takes one. The server
(commlib/bootstrap/store_server.py) is one event-loop thread in one process (rank 0, a ``commlib store``
process, or a test harness); clients keep one connection each. ``COMMLIB_STORE=host:port`` names a
store served outside the ranks (``external_address``), which ``commlib.init()`` then uses.

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

from typing import Optional, Tuple

from commlib import settings
from commlib.errors import RendezvousError, StoreLostError
from commlib.bootstrap.store_server import StoreServer
from commlib.bootstrap.store_wire import (ADD as _ADD, CHECK as _CHECK, GET as _GET, HELLO as _HELLO,
                                          HELLO_REPLY as _HELLO_REPLY, MAX_FRAME, MAX_GET_WAIT_S, REFUSED as _REFUSED,
                                          SET as _SET, Malformed as _Malformed, frames)

__all__ = ["StoreServer", "TCPStore", "MAX_FRAME", "external_address", "parse_address"]

# What a rank says when the store that rank 0's process served is gone (see TCPStore.served_by_rank0).
RANK0_STORE_ADVICE = (
    "No rank can shrink, split or rendezvous without the store. To survive rank 0, serve the store outside "
    "the ranks: run `commlib store --host HOST --port PORT` and set COMMLIB_STORE=HOST:PORT on every rank (or "
    "launch with torchrun, whose agent serves the store); docs/fault_tolerance.md")
RANK0_STORE_LOST = (
    "the store was served in rank 0's process (commlib.init() without a store or COMMLIB_STORE) and is gone "
    "with it: rank 0 died, or closed the communicator that served it. " + RANK0_STORE_ADVICE)


def parse_address(text: str, what: str = "COMMLIB_STORE") -> Tuple[str, int]:
    """``host:port`` (IPv6 as ``[addr]:port``) as (host, port); ValueError naming ``what``."""
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what}: expected host:port (e.g. 10.0.0.1:29400, [::1]:29400), got {text!r}")
    return host, int(port)


def external_address() -> Optional[Tuple[str, int]]:
    """(host, port) of the store COMMLIB_STORE names (served outside the ranks), or None when unset."""
    value = settings.get("COMMLIB_STORE")
    return parse_address(value) if value.strip() else None


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
    bounds the wait for the server to accept (rank 0 may start last). A lost connection (the
    server closed or reset it) raises StoreLostError; ``served_by_rank0`` (set by init() when rank
    0's process serves the store) makes its message say the store died with rank 0 and how to run
    the job so it does not.
    """

    def __init__(self, host: str, port: int, timeout: float = 300.0, connect_timeout: float = 60.0,
                 served_by_rank0: bool = False):
        self.timeout = float(timeout)
        self.served_by_rank0 = served_by_rank0
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
        except socket.timeout:  # a host that vanished closes nothing: its silence is all one sees
            raise RendezvousError(f"store at {self._where}: no answer to {what} {key!r} within "
                                  f"{wait:g} s (COMMLIB_TIMEOUT); expected a commlib store" +
                                  ("; it is served in rank 0's process: if rank 0 (or its host) died, the "
                                   "store died with it. " + RANK0_STORE_ADVICE if self.served_by_rank0 else "")
                                  ) from None
        except _Malformed as e:
            raise RendezvousError(f"store at {self._where}: answered {what} {key!r} with a malformed "
                                  f"frame ({e}); expected a commlib store") from None
        except ConnectionError as e:  # closed or reset by the other end: the server is gone
            raise StoreLostError(f"store at {self._where}: connection lost during {what} {key!r} ({e}): "
                                 + (RANK0_STORE_LOST if self.served_by_rank0 else
                                    "the server closed it (it stopped, or is not a commlib store)")
                                 ) from None
        except (OSError, struct.error) as e:
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
