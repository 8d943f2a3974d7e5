"""The rendezvous store's server: one thread, one event loop (selectors) over every connection.

Why an event loop: an outsider who can reach the port must not be able to make the server hold
memory or threads in proportion to what it announces or sends (docs/security.md, "The store"). So

- bytes are accounted as they arrive, never as announced: a frame's length prefix is checked
  against ``MAX_FRAME`` as soon as it is seen, and a request's bytes are received a step at a time;
- a connection holds at most one request (``max_request()`` bytes), and all together at most
  ``MAX_IN_FLIGHT_BYTES`` of requests and waiting GETs' keys: to take more, the server closes the
  connection holding the most (a working client's request is a few hundred bytes);
- a blocking GET waits at most ``MAX_GET_WAIT_S`` (the client asks again), and meanwhile its
  connection reads nothing: any input, or its hang-up, closes it at once;
- a dropped connection releases everything at once: buffers, deadline, waiters' entry (``held()``);
- at ``MAX_CONNECTIONS`` a new connection replaces the oldest that has not completed a request
  (with a key, also one that never made a signed write), else it is closed;
- a reply is queued by reference, and a connection's next request is read once its reply is sent;
- with the job's store key (``COMMLIB_SECRET``), a write not signed for its key name is refused
  (``add``, which cannot be signed, too): an outsider cannot fill the store or plant values.

The wire format is in store_wire.py (shared with the client, commlib.store.TCPStore).
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
from commlib.bootstrap.store_wire import (ADD, CHECK, GET, HELLO, HELLO_REPLY, MAX_CONNECTIONS, MAX_DATA_BYTES,
                                         MAX_FRAME, MAX_GET_WAIT_S, MAX_IN_FLIGHT_BYTES, RECV_STEP, REFUSED,
                                         SET, Malformed, frames, max_request, parse_request)  # noqa: F401 - re-exported


class _Conn:
    __slots__ = ("sock", "inbuf", "out", "since", "last_byte", "last_done", "level", "waiting", "events")

    def __init__(self, sock, now):
        self.sock, self.inbuf, self.out = sock, bytearray(), []
        self.since = self.last_byte = now
        self.last_done = 0.0
        self.level = 0        # 0: no request completed yet, 1: some, 2: a signed write (with a key)
        self.waiting = None   # a blocking GET's entry in the deadline heap: [deadline, n, key, self]
        self.events = 0

    def held(self) -> int:
        """Bytes this connection makes the server hold for it: its partial request and the key of
        its waiting GET (queued replies are references to stored values, counted as data)."""
        return len(self.inbuf) + (len(self.waiting[2]) if self.waiting else 0)


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
        self._waiters = {}           # key -> set of _Conn in a blocking GET (no empty sets)
        self._deadlines = []         # heap of the waiting GETs' entries (see _Conn.waiting)
        self._order = itertools.count()
        self._calls = []             # (function, threading.Event, result list) run by the loop
        self.data, self.data_bytes, self.in_flight = {}, 0, 0
        self.peak_in_flight = 0
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="commlib-store", daemon=True)
        self._thread.start()

    @property
    def connections(self) -> int:
        return len(self._conns)

    def held(self) -> dict:
        """What the server still references, counted in its own thread: ``connections`` open,
        ``waiting`` (connections in a blocking GET), ``waiter_keys`` (keys in the waiters' map),
        ``deadlines`` (entries in the deadline heap), ``accounted_bytes`` (the in-flight budget's
        count) and ``buffered_bytes`` (partial requests, waiting keys and queued replies of every
        connection any of these reach, plus the waiters' map's keys). A closed connection is in
        none of them."""
        return self._in_loop(self._count_held)

    def _count_held(self) -> dict:
        reached = set(self._conns.values()).union(*self._waiters.values(), (e[3] for e in self._deadlines))
        buffered = sum(len(c.inbuf) + sum(len(p) for p in c.out) for c in reached)
        keys = {id(k): k for k in itertools.chain((e[2] for e in self._deadlines), self._waiters)}
        buffered += sum(len(k) for k in keys.values())
        return {"connections": len(self._conns), "waiting": sum(len(w) for w in self._waiters.values()),
                "waiter_keys": len(self._waiters), "deadlines": len(self._deadlines),
                "accounted_bytes": self.in_flight, "buffered_bytes": buffered}

    def _in_loop(self, fn):
        """``fn()`` run by the loop thread (which alone touches the connections), or here once stopped."""
        if self._closing or not self._thread.is_alive():
            self._thread.join(10.0)
            return fn()
        done, box = threading.Event(), []
        self._calls.append((fn, done, box))
        self._wake_w.send(b"c")
        if not done.wait(10.0):
            raise TimeoutError("the store's event loop did not answer within 10 s")
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

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
                        self._run_calls()
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
            self._run_calls()

    def _run_calls(self):
        while self._calls:
            fn, done, box = self._calls.pop(0)
            try:
                box.append(fn())
            except Exception as e:  # noqa: BLE001 - handed to the caller
                box.append(e)
            done.set()

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
        # Always readable: a waiting connection reads nothing, but its hang-up (or input it must
        # not send) must end it at once; writable while a reply is queued.
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0)
        if want == c.events:
            return
        if c.events == 0:
            self._sel.register(c.sock, want, c)
        else:
            self._sel.modify(c.sock, want, c)
        c.events = want

    def _drop(self, c: _Conn):
        """Close ``c`` and release everything it held, now: buffers, deadline, waiters' entry."""
        if self._conns.pop(c.sock, None) is None:
            return
        if c.waiting:
            self._end_wait(c)
        self.in_flight -= len(c.inbuf)
        c.inbuf = bytearray()
        c.out.clear()
        if c.events:
            self._sel.unregister(c.sock)
            c.events = 0
        c.sock.close()

    def _end_wait(self, c: _Conn):
        """``c``'s blocking GET is over (answered, expired or dropped): forget its deadline, its
        waiters' entry and its accounted key."""
        entry, c.waiting = c.waiting, None
        key = entry[2]
        waiters = self._waiters.get(key)
        if waiters is not None:
            waiters.discard(c)
            if not waiters:
                del self._waiters[key]
        self._deadlines.remove(entry)  # equal only to itself: its sequence number is unique
        heapq.heapify(self._deadlines)
        self.in_flight -= len(key)

    def _read(self, c: _Conn):
        if c.waiting is not None:
            # A client sends nothing while its GET waits: this is its hang-up, or input that
            # breaks the protocol. Either way nothing more is read, and the connection ends.
            raise ConnectionError("input or hang-up while a GET waits")
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
        """Close the connections holding the most (the most stalled among equals) until ``n`` more
        bytes fit the in-flight budget. A working client holds a few hundred bytes at most."""
        while self.in_flight + n > MAX_IN_FLIGHT_BYTES:
            others = [o for o in self._conns.values() if o is not c and o.held()]
            if not others:
                return
            self._drop(max(others, key=lambda o: (o.held(), -o.last_byte)))

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
        for w in list(self._waiters.get(key, ())):
            self._answer_wait(w, b"\x01", self.data[key])

    def _answer_wait(self, c: _Conn, *parts: bytes):
        """End ``c``'s blocking GET with this reply, then serve what follows."""
        self._end_wait(c)
        self._reply(c, *parts)
        try:
            self._flush(c)
            self._serve(c)
        except Exception:  # noqa: BLE001 - as in _ready: that connection only
            self._drop(c)

    def _wait(self, c: _Conn, key: bytes, timeout: float):
        """Park ``c``'s GET of ``key`` until it is set or ``timeout`` (capped) passes."""
        if c.inbuf:  # a client sends nothing behind a blocking GET
            raise Malformed("bytes sent behind a blocking GET")
        c.waiting = [time.monotonic() + min(timeout, MAX_GET_WAIT_S), next(self._order), key, c]
        self._waiters.setdefault(key, set()).add(c)
        heapq.heappush(self._deadlines, c.waiting)
        self.in_flight += len(key)  # the key stays held while it waits: unproven bytes like any

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
                self._wait(c, key, timeout)
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
            self._answer_wait(self._deadlines[0][3], b"\x00")
