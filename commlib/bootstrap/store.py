"""A small TCP key-value store for rendezvous when torch is not in use.

It speaks the subset of torch.distributed.Store that commlib needs (``set``, blocking ``get``,
``add``, ``check``, ``wait``), so either store works wherever commlib takes one. The server runs as
daemon threads in one process (rank 0, or a test harness); clients keep one connection each.

Hardening (docs/security.md): the server binds only the address it is given; frames are limited to
``MAX_FRAME`` bytes, connections to ``MAX_CONNECTIONS`` (one thread each) and the data held to
``MAX_DATA_BYTES``; a malformed frame closes that connection only. A client first checks that it
talks to a commlib store (a hello exchange), and every operation it makes has a socket timeout: a
silent, dead or foreign server gives ``RendezvousError`` naming the address, never a hang.
"""
from __future__ import annotations

import socket
import socketserver
import struct
import threading
import time
from datetime import timedelta

from commlib.errors import RendezvousError

_SET, _GET, _ADD, _CHECK, _HELLO = 1, 2, 3, 4, 5
_HELLO_REPLY = b"commlib-store/1"
MAX_FRAME = 4 << 20          # a key or value; rendezvous values are a few hundred bytes
MAX_CONNECTIONS = 512        # one handler thread each
MAX_DATA_BYTES = 256 << 20   # keys plus values held by the server


class _Malformed(Exception):
    """A frame that breaks the protocol: the connection is closed."""


def _send(sock, *parts: bytes):
    sock.sendall(b"".join(struct.pack("!I", len(p)) + p for p in parts))


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("store connection closed")
        buf += chunk
    return bytes(buf)


def _recv(sock, limit=MAX_FRAME):
    (n,) = struct.unpack("!I", _recv_exact(sock, 4))
    if n > limit:  # refuse before reading: a frame may announce gigabytes
        raise _Malformed(f"frame of {n} bytes exceeds the {limit}-byte limit")
    return _recv_exact(sock, n)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        srv = self.server
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                cmd = _recv(sock, 1)
                if len(cmd) != 1:
                    raise _Malformed("empty command")
                cmd = cmd[0]
                if cmd == _HELLO:
                    _send(sock, _HELLO_REPLY)
                    continue
                if cmd not in (_SET, _GET, _ADD, _CHECK):
                    raise _Malformed(f"unknown command {cmd}")
                key = _recv(sock)
                if cmd == _SET:
                    value = _recv(sock)
                    with srv.cond:
                        old = srv.data.get(key)
                        grow = len(key) + len(value) - (len(key) + len(old) if old is not None else 0)
                        if srv.data_bytes + grow > MAX_DATA_BYTES:
                            raise _Malformed("store full")
                        srv.data[key] = value
                        srv.data_bytes += grow
                        srv.cond.notify_all()
                    _send(sock, b"")
                elif cmd == _GET:
                    (timeout,) = struct.unpack("!d", _recv(sock, 8).ljust(8, b"\0"))
                    if not 0 <= timeout <= 1e7:  # NaN fails too
                        raise _Malformed("bad timeout")
                    deadline = time.monotonic() + timeout
                    with srv.cond:
                        while key not in srv.data and not srv.closing:
                            left = deadline - time.monotonic()
                            if left <= 0:
                                break
                            srv.cond.wait(min(left, 1.0))
                        value = srv.data.get(key)
                    _send(sock, b"\x01" + value if value is not None else b"\x00")
                elif cmd == _ADD:
                    delta = _recv(sock, 8)
                    if len(delta) != 8:
                        raise _Malformed("bad delta")
                    (delta,) = struct.unpack("!q", delta)
                    with srv.cond:
                        try:
                            value = int(srv.data.get(key, b"0")) + delta
                        except ValueError:
                            raise _Malformed("add on a key that does not hold an integer") from None
                        srv.data_bytes += 0 if key in srv.data else len(key) + 24
                        srv.data[key] = str(value).encode()
                        srv.cond.notify_all()
                    _send(sock, struct.pack("!q", value))
                elif cmd == _CHECK:
                    with srv.cond:
                        present = key in srv.data
                    _send(sock, b"\x01" if present else b"\x00")
        except (ConnectionError, OSError, _Malformed, struct.error):
            pass  # this connection only; the server and its other clients go on


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def process_request(self, request, client_address):
        with self.cond:
            if self.connections >= MAX_CONNECTIONS:
                self.shutdown_request(request)
                return
            self.connections += 1
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.cond:
                self.connections -= 1


class StoreServer:
    """Serve a store on (host, port); port 0 picks a free one (see ``.port``).

    Binds ``host`` only: pass "127.0.0.1" for a single-host job, the address of the interface the
    other hosts reach for a multi-host one.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self._srv = _Server((host, port), _Handler, bind_and_activate=False)
        self._srv.data = {}
        self._srv.data_bytes = 0
        self._srv.connections = 0
        self._srv.cond = threading.Condition()
        self._srv.closing = False
        try:
            self._srv.server_bind()
            self._srv.server_activate()
        except BaseException:
            self._srv.server_close()
            raise
        self.host = host
        self.port = self._srv.server_address[1]
        self._thread = threading.Thread(target=self._srv.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="commlib-store", daemon=True)
        self._thread.start()

    def close(self):
        with self._srv.cond:
            self._srv.closing = True
            self._srv.cond.notify_all()
        self._srv.shutdown()
        self._srv.server_close()


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

    def close(self):
        """Close the connection to the server (idempotent); later operations raise
        RendezvousError. Without it the socket lives until garbage collection."""
        self._sock.close()

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

    def set(self, key, value):
        with self._lock:
            self._exchange("set", key, self.timeout, bytes([_SET]), self._b(key), self._b(value))

    def get(self, key) -> bytes:
        with self._lock:
            # The server answers by self.timeout; allow 2 s more for the round trip.
            reply = self._exchange("get", key, self.timeout + 2.0, bytes([_GET]), self._b(key),
                                   struct.pack("!d", self.timeout))
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
        try:
            self._sock.close()
        except OSError:
            pass
