"""The rendezvous store's server: one thread, one event loop (selectors) over every connection.

Why an event loop: an outsider who can reach the port must not be able to make the server hold
memory or threads in proportion to what it announces (docs/security.md, "The store"). So

- bytes are accounted as they arrive, never as announced: a frame's length prefix is checked
  against ``MAX_FRAME`` as soon as it is seen, and a request's bytes are received a step at a time;
- a connection holds at most one request in flight (``MAX_REQUEST`` bytes), and all connections
  together at most ``MAX_IN_FLIGHT_BYTES``: to take more, the server closes the connection whose
  partial request has waited longest for its next byte (a stalled one; a working client sends its
  request at once);
- at ``MAX_CONNECTIONS`` a new connection replaces the oldest that has not completed a request
  (with a key, also one that never made a signed write), else it is closed;
- a reply is queued by reference (a stored value is not copied per reader), and a connection's next
  request is not read until its reply is sent;
- with the job's store key (``COMMLIB_SECRET``), a write whose value is not signed for its key name
  is refused before it is stored (``add``, which cannot be signed, too): an outsider cannot fill the
  store or plant values.

Wire format (shared with commlib.store.TCPStore): frames of ``u32_be length || bytes``. A request is
a one-byte command frame followed by its fields: SET key value, GET key timeout(f64), ADD key
delta(i64), CHECK key, HELLO. Replies are one frame: SET b"" (or b"refused: why"), GET b"\\x01" +
value or b"\\x00", ADD i64 (or b"refused: why"), CHECK b"\\x01"/b"\\x00", HELLO ``HELLO_REPLY``.
"""
from __future__ import annotations

import heapq
import itertools
import selectors
import socket
import struct
import threading
import time
from typing import Optional

from commlib.bootstrap.secret import signature_ok

SET, GET, ADD, CHECK, HELLO = 1, 2, 3, 4, 5
HELLO_REPLY = b"commlib-store/1"
REFUSED = b"refused: "
MAX_FRAME = 4 << 20            # a key or value; rendezvous values are a few hundred bytes
MAX_CONNECTIONS = 512
MAX_DATA_BYTES = 256 << 20     # keys plus values held by the server
MAX_IN_FLIGHT_BYTES = 32 << 20  # partial requests held, all connections together
RECV_STEP = 256 << 10          # bytes taken from one connection at a time
_FIELDS = {SET: (MAX_FRAME, MAX_FRAME), GET: (MAX_FRAME, 8), ADD: (MAX_FRAME, 8), CHECK: (MAX_FRAME,), HELLO: ()}


def max_request() -> int:
    """The largest request a client may send: a SET of a full key and value, with its prefixes."""
    return 4 + 1 + 2 * (4 + MAX_FRAME)


class Malformed(Exception):
    """A frame that breaks the protocol: the connection is closed."""


def frames(*parts: bytes) -> bytes:
    return b"".join(struct.pack("!I", len(p)) + p for p in parts)


def parse_request(buf) -> Optional[tuple]:
    """(command, fields, bytes used) for the whole request at the start of ``buf``, or None while
    more bytes are needed. Raises Malformed as soon as a length prefix or command is impossible."""
    pos, out = 0, []
    limits = (1,)
    while len(out) < len(limits):
        if len(buf) < pos + 4:
            return None
        (n,) = struct.unpack_from("!I", buf, pos)
        if n > limits[len(out)]:  # refused from the prefix: a frame may announce gigabytes
            raise Malformed(f"frame of {n} bytes exceeds the {limits[len(out)]}-byte limit")
        if len(buf) < pos + 4 + n:
            return None
        with memoryview(buf) as view:  # one copy of the field (a slice of a bytearray is another)
            out.append(bytes(view[pos + 4:pos + 4 + n]))
        pos += 4 + n
        if len(out) == 1:
            if len(out[0]) != 1:
                raise Malformed("empty command")
            if out[0][0] not in _FIELDS:
                raise Malformed(f"unknown command {out[0][0]}")
            limits = (1,) + _FIELDS[out[0][0]]
    return out[0][0], out[1:], pos


class _Conn:
    __slots__ = ("sock", "inbuf", "out", "since", "last_byte", "last_done", "level", "waiting", "events")

    def __init__(self, sock, now):
        self.sock, self.inbuf, self.out = sock, bytearray(), []
        self.since = self.last_byte = now
        self.last_done = 0.0
        self.level = 0        # 0: no request completed yet, 1: some, 2: a signed write (with a key)
        self.waiting = None   # (key, deadline) of a blocking GET
        self.events = 0


class StoreServer:
    """Serve a store on (host, port); port 0 picks a free one (see ``.port``).

    Binds ``host`` only: pass "127.0.0.1" for a single-host job, the address of the interface the
    other hosts reach for a multi-host one. ``key`` (commlib.secret.store_key()) makes the server
    refuse writes not signed with it.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, key: Optional[bytes] = None):
        self._key = key
        self._listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(128)
            self._listener.setblocking(False)
            self._wake_r, self._wake_w = socket.socketpair()
        except BaseException:
            self._listener.close()
            raise
        self.host, self.port = host, self._listener.getsockname()[1]
        self.address = self._listener.getsockname()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns = {}             # socket -> _Conn
        self._waiters = {}           # key -> set of _Conn in a blocking GET
        self._deadlines = []         # heap of (deadline, n, _Conn)
        self._order = itertools.count()
        self.data, self.data_bytes, self.in_flight = {}, 0, 0
        self.peak_in_flight = 0
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="commlib-store", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        return len(self._conns)

    def close(self):
        """Stop serving (idempotent): pending blocking GETs are answered "not set", every
        connection is closed and the thread joined."""
        if self._closing:
            return
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(10.0)

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self):
        try:
            while not self._closing:
                timeout = 0.5
                if self._deadlines:
                    timeout = min(timeout, max(0.0, self._deadlines[0][0] - time.monotonic()))
                for key, mask in self._sel.select(timeout):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._wake_r.recv(64)
                    elif key.fileobj in self._conns:
                        self._ready(key.data, mask)
                self._expire()
        finally:
            for c in list(self._conns.values()):
                if c.waiting:
                    try:
                        c.sock.send(frames(b"\x00"), socket.MSG_DONTWAIT)
                    except OSError:
                        pass
                self._drop(c)
            self._sel.close()
            for s in (self._listener, self._wake_r, self._wake_w):
                s.close()

    def _ready(self, c: _Conn, mask: int):
        try:
            if mask & selectors.EVENT_WRITE:
                self._flush(c)
            if mask & selectors.EVENT_READ and c.sock in self._conns:
                self._read(c)
            if c.sock in self._conns:
                self._serve(c)
        except Exception:  # noqa: BLE001 - malformed input, a lost peer, or a bug: this connection only
            self._drop(c)  # the server and its other clients go on

    def _accept(self):
        for _ in range(64):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. out of descriptors: the backlog waits for the next round
                return
            if len(self._conns) >= MAX_CONNECTIONS and not self._evict_for_connection():
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            c = _Conn(sock, time.monotonic())
            self._conns[sock] = c
            self._watch(c)

    def _evict_for_connection(self) -> bool:
        """Close the connection least likely to be a working client; False if none may go."""
        fresh = [c for c in self._conns.values() if c.level == 0]
        if fresh:
            self._drop(min(fresh, key=lambda c: c.since))
            return True
        if self._key is not None:  # a signed write proves a rank of the job; nothing else does
            unproven = [c for c in self._conns.values() if c.level < 2]
            if unproven:
                self._drop(min(unproven, key=lambda c: c.last_done))
                return True
        return False

    def _watch(self, c: _Conn):
        # Always readable (a client that closes while its GET waits frees its slot at once);
        # writable while a reply is queued.
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0)
        if want == c.events:
            return
        if c.events == 0:
            self._sel.register(c.sock, want, c)
        else:
            self._sel.modify(c.sock, want, c)
        c.events = want

    def _drop(self, c: _Conn):
        if self._conns.pop(c.sock, None) is None:
            return
        self.in_flight -= len(c.inbuf)
        if c.waiting:
            self._waiters.get(c.waiting[0], set()).discard(c)
        if c.events:
            self._sel.unregister(c.sock)
        c.sock.close()

    def _read(self, c: _Conn):
        room = min(RECV_STEP, max_request() - len(c.inbuf))
        if room <= 0:
            raise Malformed("request larger than any valid one")
        self._make_room(c, room)
        try:
            data = c.sock.recv(room)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            raise ConnectionError("closed by the client")
        c.inbuf += data
        self.in_flight += len(data)
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        c.last_byte = time.monotonic()

    def _make_room(self, c: _Conn, n: int):
        """Close the most stalled partial requests until ``n`` more bytes fit the in-flight budget."""
        while self.in_flight + n > MAX_IN_FLIGHT_BYTES:
            others = [o for o in self._conns.values() if o is not c and o.inbuf]
            if not others:
                return
            self._drop(min(others, key=lambda o: o.last_byte))

    def _flush(self, c: _Conn):
        while c.out:
            try:
                sent = c.sock.send(c.out[0])
            except (BlockingIOError, InterruptedError):
                return
            if sent < len(c.out[0]):
                c.out[0] = memoryview(c.out[0])[sent:]
                return
            c.out.pop(0)

    def _serve(self, c: _Conn):
        """Answer every whole request received, one at a time (the next once the reply is sent)."""
        while not c.out and not c.waiting:
            req = parse_request(c.inbuf)
            if req is None:
                break
            cmd, fields, used = req
            del c.inbuf[:used]
            self.in_flight -= used
            self._handle(c, cmd, fields)
            c.last_done = time.monotonic()
            c.level = max(c.level, 1)
            self._flush(c)
        self._watch(c)

    def _reply(self, c: _Conn, *parts: bytes):
        # The length prefix, then the parts by reference: a stored value is not copied per reader.
        c.out.append(struct.pack("!I", sum(len(p) for p in parts)))
        c.out.extend(p for p in parts if p)

    def _answer_waiters(self, key: bytes):
        for w in self._waiters.pop(key, ()):
            w.waiting = None
            self._reply(w, b"\x01", self.data[key])
            try:
                self._flush(w)
                self._serve(w)
            except Exception:  # noqa: BLE001 - as in _ready: that connection only
                self._drop(w)

    def _handle(self, c: _Conn, cmd: int, fields):
        if cmd == HELLO:
            return self._reply(c, HELLO_REPLY)
        key = fields[0]
        if cmd == SET:
            why = self._refusal(key, fields[1])
            if why:
                return self._reply(c, REFUSED + why.encode())
            old = self.data.get(key)
            grow = len(key) + len(fields[1]) - (len(key) + len(old) if old is not None else 0)
            if self.data_bytes + grow > MAX_DATA_BYTES:
                raise Malformed("store full")
            self.data[key] = fields[1]
            self.data_bytes += grow
            if self._key is not None:
                c.level = 2
            self._reply(c, b"")
            self._answer_waiters(key)
        elif cmd == GET:
            (timeout,) = struct.unpack("!d", fields[1].ljust(8, b"\0"))
            if not 0 <= timeout <= 1e7:  # NaN fails too
                raise Malformed("bad timeout")
            if key in self.data or timeout == 0:
                value = self.data.get(key)
                self._reply(c, *((b"\x01", value) if value is not None else (b"\x00",)))
            else:
                c.waiting = (key, time.monotonic() + timeout)
                self._waiters.setdefault(key, set()).add(c)
                heapq.heappush(self._deadlines, (c.waiting[1], next(self._order), c))
        elif cmd == ADD:
            if self._key is not None:
                return self._reply(c, REFUSED + b"counters cannot be signed; COMMLIB_SECRET is set on this store")
            if len(fields[1]) != 8:
                raise Malformed("bad delta")
            (delta,) = struct.unpack("!q", fields[1])
            try:
                value = int(self.data.get(key, b"0")) + delta
            except ValueError:
                raise Malformed("add on a key that does not hold an integer") from None
            self.data_bytes += 0 if key in self.data else len(key) + 24
            self.data[key] = str(value).encode()
            self._reply(c, struct.pack("!q", value))
            self._answer_waiters(key)
        else:  # CHECK
            self._reply(c, b"\x01" if key in self.data else b"\x00")

    def _refusal(self, key: bytes, value: bytes) -> str:
        """Why a write is refused (empty: accepted). Only with a key: the value must be signed
        for this key name (commlib/secret.py's format)."""
        if self._key is None:
            return ""
        if signature_ok(self._key, key, value):
            return ""
        return ("value not signed with this job's COMMLIB_SECRET (set it, and the same, on every rank); "
                "the store keeps only signed values")

    def _expire(self):
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, c = heapq.heappop(self._deadlines)
            if c.waiting is None or c.waiting[1] != deadline or c.sock not in self._conns:
                continue  # answered, or gone
            self._waiters.get(c.waiting[0], set()).discard(c)
            c.waiting = None
            self._reply(c, b"\x00")
            try:
                self._flush(c)
                self._serve(c)
            except Exception:  # noqa: BLE001 - as in _ready: that connection only
                self._drop(c)
