"""How a grow admits joiners (commlib/core/grow.py): request slots, an offer with a nonce drawn by
the members, and the joiner's signed accept of it. It needs only ``set``/``get``/``check``, so it
runs alike on a plain store and, with COMMLIB_SECRET, on a signed one (which has no counters).

Keys under ``<job>/join`` (``<job>``: the prefix the job's ranks gave ``commlib.init``):

- ``req/<i>``, a joiner's request in slot i: its random ``id``, pid, host, commlib version and
  the settings every rank must share. A joiner writes the first empty slot from ``cursor``. Two
  joiners that raced for one slot learn from its answer which of them it went to; the other takes
  the next empty slot.
- ``ans/<i>``, the grow leader's answer: an offer ``{"id", "grow", "nonce"}`` (the id it read, the
  grow's prefix, 16 fresh random bytes), or ``{"skip": why}`` for a slot it could not read.
- ``acc/<i>``, written once by the joiner: ``{"id", "nonce"}`` accepting the offer, or ``{"id",
  "withdrawn": true}`` when its timeout passed first. The leader admits slot i only when
  ``acc/<i>`` carries its own nonce; the joiner counts itself admitted only when the grow's
  decision lists that nonce. So a joiner that gave up is never admitted, and of two grows that
  offered one slot, only the one whose offer was accepted admits it.
- ``cursor``: the first slot no grow has dealt with yet.

With COMMLIB_SECRET every value is signed for its key name (commlib/bootstrap/secret.py), and a
value that does not verify is read as unreadable, never as an error: the request is skipped, the
offer or accept is waited for on. The accept is the joiner's proof of the secret, made after the
members drew the nonce: a replayed request (an old signed value in its own slot) can be offered
but not accepted, a replayed accept names an old nonce, and a forged value does not verify, so
none of them is admitted, and the members map no memory of, and open no link to, any process that
has not proved the secret. docs/security.md says what a process can do without it.
"""
from __future__ import annotations

import json
import secrets
import time
from typing import Callable, Optional, Tuple

from commlib.bootstrap.wait import wait_until
from commlib.errors import RendezvousError

# How long the leader waits for the accept of an offer (a live joiner answers within its ~20 ms
# poll): after it, the slot is passed over and a joiner that accepts later asks again.
ACCEPT_WAIT_S = 5.0
REQUEST_FIELDS = ("id", "pid", "host", "version", "settings")


def read_record(store, key: str) -> Optional[dict]:
    """The JSON object under ``key``: None when absent, not signed as the store requires (an
    outsider's or another secret's value), or not a JSON object."""
    try:
        if not store.check([key]):
            return None
        raw = bytes(store.get(key))
    except RendezvousError:  # a signed store's "bad signature" / "not signed"
        return None
    try:
        rec = json.loads(raw.decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) else None


def parse_request(rec) -> Optional[dict]:
    """``rec`` if it is a well-formed join request, else None."""
    if not isinstance(rec, dict) or set(rec) != set(REQUEST_FIELDS):
        return None
    ok = (isinstance(rec["id"], str) and isinstance(rec["pid"], int) and not isinstance(rec["pid"], bool)
          and isinstance(rec["host"], str) and isinstance(rec["version"], str)
          and isinstance(rec["settings"], dict) and all(isinstance(v, str) for v in rec["settings"].values()))
    return rec if ok else None


class _Slots:
    """The keys of ``job``'s join slots in ``store``."""

    def __init__(self, store, job: str):
        self.store, self.job = store, job

    def key(self, name: str, i: Optional[int] = None) -> str:
        return f"{self.job}/join/{name}" if i is None else f"{self.job}/join/{name}/{i}"

    def cursor(self) -> int:
        rec = read_record(self.store, self.key("cursor"))
        i = rec.get("next") if rec else None
        return i if isinstance(i, int) and not isinstance(i, bool) and i >= 1 else 1

    def put(self, name: str, i: Optional[int], rec: dict):
        self.store.set(self.key(name, i), json.dumps(rec))


class Offers(_Slots):
    """The grow leader's side: reads slots in order and offers each readable request."""

    def __init__(self, store, job: str, grow_prefix: str):
        super().__init__(store, job)
        self.grow = grow_prefix
        self.next = self.cursor()

    def take(self, poll: Callable[[], None], gone: Callable[[dict], bool]) -> Optional[Tuple[int, str, dict]]:
        """The next slot's outcome, without waiting for a request to appear: None when slot
        ``next`` is empty; else (slot, nonce, request) when its joiner accepted this grow's
        offer, or (slot, "", {}) when the slot was passed over (unreadable, withdrawn, accepted
        elsewhere, or no accept within ACCEPT_WAIT_S). ``poll()`` runs while waiting for the accept
        (it may raise); ``gone(request)``: whether its process is known to be dead."""
        i = self.next
        if not self.store.check([self.key("req", i)]):
            return None
        self.next = i + 1
        req = parse_request(read_record(self.store, self.key("req", i)))
        if req is None:
            self.put("ans", i, {"skip": "unreadable request (not signed with this job's secret, or malformed)"})
            return self._passed(i)
        nonce = secrets.token_hex(16)
        self.put("ans", i, {"id": req["id"], "grow": self.grow, "nonce": nonce})

        def verdict():
            acc = read_record(self.store, self.key("acc", i))
            if acc is None:
                return "dead" if gone(req) else None
            return "accepted" if acc.get("id") == req["id"] and acc.get("nonce") == nonce else "other"

        try:
            outcome = wait_until(verdict, time.monotonic() + ACCEPT_WAIT_S, poll=poll, max_pause=0.01,
                                 on_timeout=_NoAccept)
        except _NoAccept:
            outcome = "late"
        return (i, nonce, req) if outcome == "accepted" else self._passed(i)

    def _passed(self, i: int):
        self.put("cursor", None, {"next": self.next})
        return i, "", {}

    def admitted(self, i: int):
        self.put("cursor", None, {"next": self.next})


class _NoAccept(Exception):
    """No accept within ACCEPT_WAIT_S (internal to Offers.take)."""


class Asking(_Slots):
    """A joiner's side: its request, in the first empty slot, until a grow offers it."""

    def __init__(self, store, job: str, request: dict):
        super().__init__(store, job)
        self.id = secrets.token_hex(8)
        self.request = dict(request, id=self.id)

    def offer(self, deadline: float, on_timeout: Callable[[], Exception]) -> Tuple[int, dict]:
        """(slot, offer) once a grow offered this request and this joiner accepted it. Past
        ``deadline`` the request is withdrawn and ``on_timeout()`` raised."""
        while True:
            i = self.cursor()
            while self.store.check([self.key("req", i)]):
                i += 1
            self.put("req", i, self.request)
            answer = {}

            def answered():
                answer.update(read_record(self.store, self.key("ans", i)) or {})
                return bool(answer)

            def give_up():
                self.put("acc", i, {"id": self.id, "withdrawn": True})
                return on_timeout()

            wait_until(answered, deadline, on_timeout=give_up)
            if answer.get("id") == self.id and isinstance(answer.get("grow"), str) \
                    and isinstance(answer.get("nonce"), str):
                self.put("acc", i, {"id": self.id, "nonce": answer["nonce"]})
                return i, answer
            # the slot went to another joiner, or its content was unreadable: ask again


__all__ = ["ACCEPT_WAIT_S", "Asking", "Offers", "parse_request", "read_record"]
