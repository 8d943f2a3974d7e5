"""A small TCP key-value store for rendezvous when torch is not in use.

It speaks the subset of torch.distributed.Store that commlib needs (``set``, blocking ``get``,
``add``, ``wait``), so either store works wherever commlib takes one. The server runs as a daemon
thread in one process (rank 0, or a test harness); clients keep one connection each.
"""
from __future__ import annotations

import socket
import socketserver
import struct
import threading
import time
from datetime import timedelta

_SET, _GET, _ADD, _CHECK = 1, 2, 3, 4


def _send(sock, *parts: bytes):
    sock.sendall(b"".join(struct.pack("!I", len(p)) + p for p in parts))


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("store connection closed")
        buf += chunk
    return bytes(buf)


def _recv(sock):
    (n,) = struct.unpack("!I", _recv_exact(sock, 4))
    return _recv_exact(sock, n)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        srv = self.server
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                cmd = _recv(sock)[0]
                key = _recv(sock)
                if cmd == _SET:
                    value = _recv(sock)
                    with srv.cond:
                        srv.data[key] = value
                        srv.cond.notify_all()
                    _send(sock, b"")
                elif cmd == _GET:
                    (timeout,) = struct.unpack("!d", _recv(sock))
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
                    (delta,) = struct.unpack("!q", _recv(sock))
                    with srv.cond:
                        value = int(srv.data.get(key, b"0")) + delta
                        srv.data[key] = str(value).encode()
                        srv.cond.notify_all()
                    _send(sock, struct.pack("!q", value))
                elif cmd == _CHECK:
                    with srv.cond:
                        present = key in srv.data
                    _send(sock, b"\x01" if present else b"\x00")
        except (ConnectionError, OSError):
            pass


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class StoreServer:
    """Serve a store on (host, port); port 0 picks a free one (see ``.port``)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self._srv = _Server((host, port), _Handler)
        self._srv.data = {}
        self._srv.cond = threading.Condition()
        self._srv.closing = False
        self.host = host
        self.port = self._srv.server_address[1]
        self._thread = threading.Thread(target=self._srv.serve_forever, name="commlib-store", daemon=True)
        self._thread.start()

    def close(self):
        with self._srv.cond:
            self._srv.closing = True
            self._srv.cond.notify_all()
        self._srv.shutdown()
        self._srv.server_close()


class TCPStore:
    """Client of a StoreServer, with torch.distributed.Store's method names."""

    def __init__(self, host: str, port: int, timeout: float = 300.0, connect_timeout: float = 60.0):
        self.timeout = timeout
        deadline = time.monotonic() + connect_timeout
        while True:
            try:
                self._sock = socket.create_connection((host, port), timeout=5)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise ConnectionError(f"store: cannot reach {host}:{port} ({e})") from None
                time.sleep(0.05)
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()

    @staticmethod
    def _b(x):
        return x.encode() if isinstance(x, str) else bytes(x)

    def set(self, key, value):
        with self._lock:
            _send(self._sock, bytes([_SET]), self._b(key), self._b(value))
            _recv(self._sock)

    def get(self, key) -> bytes:
        with self._lock:
            _send(self._sock, bytes([_GET]), self._b(key), struct.pack("!d", self.timeout))
            reply = _recv(self._sock)
        if reply[:1] != b"\x01":
            raise TimeoutError(f"store: key {key!r} not set within {self.timeout:.0f} s")
        return reply[1:]

    def add(self, key, delta: int) -> int:
        with self._lock:
            _send(self._sock, bytes([_ADD]), self._b(key), struct.pack("!q", int(delta)))
            return struct.unpack("!q", _recv(self._sock))[0]

    def check(self, keys) -> bool:
        with self._lock:
            for k in keys:
                _send(self._sock, bytes([_CHECK]), self._b(k))
                if _recv(self._sock) != b"\x01":
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
