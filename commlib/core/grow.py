"""Communicator.grow and commlib.join: replacement processes join a running job's communicator.

Keys, under the job's prefix ``<job>`` (the prefix ``commlib.init`` was given; a shrink or grow
keeps its communicator's job) and the grow's own ``<g> = <prefix>/grow<n>`` (n counts this
communicator's grows, the same on every member since each calls grow once per attempt):

1. Request. A joiner takes a ticket ``t`` (``<job>/join/tickets``, an atomic add), publishes who
   it is under ``<job>/join/req/<t>`` (pid, host, commlib version, the settings every rank must
   share) and waits for ``<job>/join/ans/<t>``.
2. Admission. The grow's leader (its rank 0) claims tickets in order, ``<job>/join/claim/<t>``
   (an atomic add: the first adder owns the ticket, so two grows never admit one joiner and a
   joiner that gave up is never admitted), answers each claimed joiner with ``<g>`` (from then on
   it watches ``<g>/error``, so any rank's error fails it too), and checks its request: another
   version or setting fails the grow on every rank, naming the setting. A joiner whose timeout
   passes claims its own ticket first and raises RendezvousError naming the grow it waited for.
3. Decision. The leader publishes ``<g>/decision``: the admitted tickets, in ticket order. The
   new ranks: the members keep their order (0..size-1), joiners follow in ticket order.
4. Build and commit, as shrink's (commlib.core.shrink.await_all_built): the new communicator
   under ``<g>``, then ``built/<rank>``; grow and join return on every rank or on none.

While waiting, members watch each other through the old communicator's links and the joiners on
their host by pid: a death fails the grow on every rank at once with PeerError naming it (call
grow again: the joiners that were admitted to a failed grow are refused, they join again).
``commlib.bootstrap.phases`` names the steps: ``admitted`` (a joiner got its answer) and the
build's own.
"""
from __future__ import annotations

import json
import os
import time
from typing import Optional

from commlib import settings
from commlib.bootstrap import phases
from commlib.bootstrap.hosts import host_id
from commlib.bootstrap.secret import SignedStore
from commlib.core.rebuild import RebuildAgreement, await_all_built
from commlib.core.shrink import gone_ranks, process_gone
from commlib.errors import CommError, PeerError, RendezvousError

# Settings that change what every rank computes or lays out: a joiner must have the job's values.
SHARED_SETTINGS = ("COMMLIB_SHM_SLOTS", "COMMLIB_SHM_SLOT_BYTES", "COMMLIB_CPU_PATH", "COMMLIB_HIER_SEGMENT",
                   "COMMLIB_TOPOLOGY", "COMMLIB_TUNING", "COMMLIB_STREAM_BYTES", "COMMLIB_COPY_CHUNK_BYTES",
                   "COMMLIB_TCP_CHUNK_BYTES", "COMMLIB_TCP_NCONNS", "COMMLIB_DEVICE_SLOTS",
                   "COMMLIB_DEVICE_SLOT_BYTES")
DIED = "died during the grow"
_REQUEST_FIELDS = ("pid", "host", "version", "settings")


def refuse_signed_store(store, what: str):
    """Tickets are store counters, which a signed store (COMMLIB_SECRET) cannot hold: refuse at
    once, on every rank alike (they all have the same store), rather than let one rank fail alone."""
    if isinstance(store, SignedStore):
        raise RendezvousError(f"{what}: not available with COMMLIB_SECRET yet: joiners take tickets from a "
                              "store counter, which a signed store cannot hold (docs/fault_tolerance.md, "
                              "'Growing back')")


def identity() -> dict:
    """This process's join request: who it is and the settings it must share with the job."""
    import commlib

    shared = {name: settings.get(name) for name in SHARED_SETTINGS}
    shared.update({k: v for k, v in os.environ.items() if k.startswith("COMMLIB_ALGO_")})
    return {"pid": os.getpid(), "host": host_id(), "version": commlib.__version__, "settings": shared}


def mismatch(job: dict, joiner: dict) -> Optional[str]:
    """What of ``joiner``'s request differs from ``job``'s identity (None when nothing does)."""
    if joiner["version"] != job["version"]:
        return f"commlib version {joiner['version']!r}, the job's is {job['version']!r}"
    for name in sorted(set(job["settings"]) | set(joiner["settings"])):
        mine, theirs = job["settings"].get(name, ""), joiner["settings"].get(name, "")
        if mine != theirs:
            return f"{name}={theirs!r}, the job's is {name}={mine!r}"
    return None


def _parse_request(raw: bytes) -> Optional[dict]:
    try:
        rec = json.loads(bytes(raw).decode())
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(rec, dict) or set(rec) != set(_REQUEST_FIELDS):
        return None
    if not (isinstance(rec["pid"], int) and isinstance(rec["host"], str) and isinstance(rec["version"], str)
            and isinstance(rec["settings"], dict) and all(isinstance(v, str) for v in rec["settings"].values())):
        return None
    return rec


class _Grow(RebuildAgreement):
    """One member's side of grow #n over ``comm`` (see the module docstring)."""

    def __init__(self, comm, n: int, timeout: float, rendezvous):
        super().__init__(comm, "grow", n, timeout, rendezvous)
        self.job = comm._job
        self.joiners = {}  # ticket -> request, once admitted (the leader's, then everyone's)
        self.here = host_id()

    def relay(self):
        try:
            self.rdv.raise_reported()
        except RendezvousError as exc:
            self.raise_as_death(exc)

    def raise_as_death(self, exc: CommError):
        """A death seen now (a member, or a joiner on this host) or reported by another rank is a
        PeerError on every rank, however it was noticed."""
        if isinstance(exc, PeerError) and DIED in str(exc):
            raise exc
        self.watch()
        if DIED in str(exc):
            raise PeerError(str(exc)) from None
        raise exc

    def died(self, who: str):
        self.fail(PeerError(f"{self.what}: {who} {DIED} (rank {self.me} saw it); call grow again"))

    def watch(self):
        """PeerError on every rank when a member or an admitted joiner on this host died."""
        dead = sorted(gone_ranks(self.comm, ("dead",)))
        if dead:
            self.died(f"rank(s) {dead}")
        for t, req in sorted(self.joiners.items()):
            if req["host"] == self.here and process_gone(req["pid"]):
                self.died(f"joiner #{t} (pid {req['pid']})")

    def key(self, name: str) -> str:
        return f"{self.job}/join/{name}"

    # -- 2. admission (the leader) ------------------------------------------------------------
    def admit(self, n: Optional[int], window: float):
        store, mine = self.rdv.store, identity()
        cursor_key = self.key("cursor")
        t = int(bytes(store.get(cursor_key)).decode()) if store.check([cursor_key]) else 1
        until = time.monotonic() + window
        pause = 0.001
        while n is None or len(self.joiners) < n:
            count = store.add(self.key("tickets"), 0)
            while t <= count and (n is None or len(self.joiners) < n):
                if store.add(self.key(f"claim/{t}"), 1) == 1:  # ours; a joiner that gave up took it first
                    store.set(self.key(f"ans/{t}"), self.rdv.prefix)
                    self.joiners[t] = self._request(t)
                t += 1
            store.set(cursor_key, str(t))
            self.relay()
            self.watch()
            if time.monotonic() > until:
                if n is None and self.joiners:
                    break
                asked = f"{len(self.joiners)} asked" if n is not None else "none asked"
                self.fail(RendezvousError(
                    f"{self.what}: waited {window:g} s for {n if n is not None else 'any'} process(es) to "
                    f"join job {self.job!r} (commlib.join), {asked}"))
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
        self.rdv.set("decision", json.dumps({"joiners": sorted(self.joiners), "size": self.size}))

    def _request(self, t: int) -> dict:
        """Joiner #t's request (published right after its ticket), checked against this job."""
        full = self.key(f"req/{t}")
        while not self.rdv.store.check([full]):
            self.relay()
            self._waited_too_long([], f"see joiner #{t}'s request")
            time.sleep(0.002)
        raw = self.rdv.store.get(full)
        req = _parse_request(raw)
        if req is None:
            self.fail(RendezvousError(f"{self.what}: joiner #{t}'s request is malformed: {bytes(raw)[:80]!r}"))
        wrong = mismatch(identity(), req)
        if wrong:
            self.fail(RendezvousError(f"{self.what}: refused joiner #{t} (pid {req['pid']} on {req['host']}): "
                                      f"it has {wrong}"))
        return req

    # -- 3. decision (everyone else) ----------------------------------------------------------------
    def await_decision(self, window: float):
        self.rdv.deadline = time.monotonic() + window + self.rdv.timeout  # the leader's window, then ours
        pause = 0.001
        while not self.rdv.store.check([f"{self.rdv.prefix}/decision"]):
            self.relay()
            self.watch()
            self._waited_too_long([0], "decide who joins")
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
        rec = json.loads(bytes(self.rdv.store.get(f"{self.rdv.prefix}/decision")).decode())
        for t in rec["joiners"]:
            req = _parse_request(self.rdv.store.get(self.key(f"req/{t}")))
            if req is None:
                self.fail(RendezvousError(f"{self.what}: joiner #{t}'s request is malformed"))
            self.joiners[t] = req

    # -- 4. build and commit ----------------------------------------------------------------------
    def build(self, create):
        size = self.size + len(self.joiners)
        self.rdv.deadline = time.monotonic() + self.rdv.timeout
        try:
            new = create(self.comm._store, self.rdv.prefix, self.me, size, self.rdv.timeout, check=self.watch)
        except CommError as exc:
            self.raise_as_death(exc)
        phases.reached(self.rdv.prefix, "built")
        await_all_built(self, self.me, range(size), new, lambda: gone_ranks(new, ("dead",)),
                        lambda ranks: self.died(self.describe(ranks)))
        return new

    def describe(self, ranks) -> str:
        """The grown communicator's ``ranks``, joiners named by their ticket and pid."""
        tickets = sorted(self.joiners)
        names = [f"rank {r}" if r < self.size else
                 f"rank {r} (joiner #{tickets[r - self.size]}, pid {self.joiners[tickets[r - self.size]]['pid']})"
                 for r in sorted(ranks)]
        return ", ".join(names) + " of the grown communicator"


def grow(comm, n: Optional[int], k: int, timeout: float, window: float, rendezvous, create):
    """Implementation of Communicator.grow (collective over ``comm``): ``n`` joiners (None: those
    that asked within ``window`` seconds, at least one). ``rendezvous`` and ``create`` are
    commlib.init's (passed in, so this module sits below commlib.init)."""
    refuse_signed_store(comm._store, f"grow #{k} of {comm._prefix!r}")
    g = _Grow(comm, k, timeout, rendezvous)
    if g.me == 0:
        g.admit(n, window)
    else:
        g.await_decision(window)
    return g.build(create)


class _Joiner:
    """A joiner's side: its ticket, then the grow that admitted it (``rdv`` once answered)."""

    def __init__(self, store, job: str, timeout: float):
        self.store, self.job, self.timeout = store, job, timeout
        self.rdv = None

    def relay(self):
        try:
            self.rdv.raise_reported()
        except RendezvousError as exc:
            raise (PeerError(str(exc)) if DIED in str(exc) else exc) from None

    def _waited_too_long(self, ranks, step: str):
        if time.monotonic() > self.rdv.deadline:
            raise RendezvousError(f"join {self.rdv.prefix!r}: waited {self.timeout:g} s for rank(s) "
                                  f"{sorted(ranks)} to {step}")

    def died(self, ranks):
        raise PeerError(f"join {self.rdv.prefix!r}: rank(s) {sorted(ranks)} {DIED}")

    def request(self):
        """Ask to join; return (ticket, the admitting grow's prefix), or raise once the timeout passed."""
        t = self.store.add(f"{self.job}/join/tickets", 1)
        self.store.set(f"{self.job}/join/req/{t}", json.dumps(identity()))
        ans = f"{self.job}/join/ans/{t}"
        deadline = time.monotonic() + self.timeout
        pause = 0.001
        while not self.store.check([ans]):
            if time.monotonic() > deadline and self.store.add(f"{self.job}/join/claim/{t}", 1) == 1:
                raise RendezvousError(
                    f"join: waited {self.timeout:g} s for a grow of job {self.job!r} to admit request #{t} "
                    f"(no member called comm.grow(); keys under {self.job + '/join'!r})")
            time.sleep(pause)  # past the deadline only when a grow claimed it: its answer comes next
            pause = min(pause * 2, 0.02)
        return t, bytes(self.store.get(ans)).decode()

    def build(self, rendezvous, create):
        ticket, prefix = self.request()
        self.rdv = rendezvous(self.store, prefix, -1, self.timeout)
        phases.reached(prefix, "admitted")
        try:
            rec = json.loads(bytes(self.rdv.wait("decision", "the grow's leader to decide who joins")).decode())
            tickets, size_before = rec["joiners"], rec["size"]
            rank = size_before + tickets.index(ticket)
            self.rdv.rank = rank
            self.rdv.deadline = time.monotonic() + self.timeout
            new = create(self.store, prefix, rank, size_before + len(tickets), self.timeout)
        except CommError as exc:
            self.relay()
            raise (PeerError(str(exc)) if DIED in str(exc) else exc) from None
        await_all_built(self, rank, range(new.size), new, lambda: gone_ranks(new, ("dead",)), self.died)
        return new


def join(store, job: str, timeout: float, rendezvous, create):
    """Implementation of commlib.join: ask to join ``job`` through ``store``; the grown
    communicator once a grow admitted this process and everyone built it."""
    refuse_signed_store(store, f"join {job!r}")
    return _Joiner(store, job, timeout).build(rendezvous, create)


__all__ = ["SHARED_SETTINGS", "grow", "identity", "join", "mismatch"]
