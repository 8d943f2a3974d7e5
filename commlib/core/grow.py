"""Communicator.grow and commlib.join: replacement processes join a running job's communicator.

Keys, under the job's prefix ``<job>`` (the prefix ``commlib.init`` was given; a shrink or grow
keeps its communicator's job) and the grow's own ``<g> = <prefix>/grow<n>`` (n counts this
communicator's grows, the same on every member since each calls grow once per attempt):

1. Request and admission (commlib/core/admission.py): a joiner writes its request into a slot
   under ``<job>/join``; the grow's leader (its rank 0) reads the slots in order and offers each
   readable request ``<g>`` with a fresh nonce; the joiner accepts by writing the nonce back
   (signed, with COMMLIB_SECRET: its proof of the secret). Only accepted slots are admitted: a
   joiner that gave up, one that took another grow's offer, and an outsider's forged or replayed
   request are passed over and stop nothing. The leader then checks the request: another
   version or setting fails the grow on every rank (the joiner watches ``<g>/error`` from its
   accept on), naming the setting.
2. Decision. The leader publishes ``<g>/decision``: the admitted slots, their nonces and
   requests, in slot order. The new ranks: the members keep their order (0..size-1), joiners
   follow in slot order. A joiner the decision does not list (its accept came too late) asks again.
3. Build and commit, as shrink's (commlib.core.rebuild.await_all_built): the new communicator
   under ``<g>``, then ``built/<rank>``; grow and join return on every rank or on none.

While waiting, members watch each other through the old communicator's links and the admitted
joiners on their host by pid: a death fails the grow on every rank at once with PeerError naming
it (call grow again: the joiners that were admitted to a failed grow are refused, they join again).
``commlib.bootstrap.phases`` names the steps: ``admitted`` (a joiner accepted an offer) and the
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
from commlib.bootstrap.secret import secured
from commlib.bootstrap.wait import wait_until
from commlib.core.admission import ACCEPT_WAIT_S, Asking, Offers, parse_request
from commlib.core.rebuild import MAX_PAUSE_S, RebuildAgreement, await_all_built
from commlib.core.shrink import gone_ranks, process_gone
from commlib.errors import CommError, PeerError, RendezvousError

# Settings that change what every rank computes or lays out: a joiner must have the job's values.
SHARED_SETTINGS = ("COMMLIB_SHM_SLOTS", "COMMLIB_SHM_SLOT_BYTES", "COMMLIB_CPU_PATH", "COMMLIB_HIER_SEGMENT",
                   "COMMLIB_TOPOLOGY", "COMMLIB_TUNING", "COMMLIB_STREAM_BYTES", "COMMLIB_COPY_CHUNK_BYTES",
                   "COMMLIB_TCP_CHUNK_BYTES", "COMMLIB_TCP_NCONNS", "COMMLIB_DEVICE_SLOTS", "COMMLIB_COMPRESS_PIECE_BYTES",
                   "COMMLIB_DEVICE_SLOT_BYTES")
DIED = "died during the grow"


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


def _parse_decision(raw: bytes) -> Optional[tuple]:
    """The decision: (the members' number, the admitted joiners [(slot, nonce, request)]), or
    None when malformed."""
    try:
        rec = json.loads(bytes(raw).decode())
        out = [(j["slot"], j["nonce"], parse_request(j["request"])) for j in rec["joiners"]]
        size = rec["size"]
    except (ValueError, UnicodeDecodeError, TypeError, KeyError):
        return None
    if not isinstance(size, int) or any(not isinstance(t, int) or not isinstance(nonce, str) or req is None
                                        for t, nonce, req in out):
        return None
    return size, out


class _Grow(RebuildAgreement):
    """One member's side of grow #n over ``comm`` (see the module docstring)."""

    def __init__(self, comm, n: int, timeout: float, rendezvous):
        super().__init__(comm, "grow", n, timeout, rendezvous)
        self.job = comm._job
        self.joiners = {}  # slot -> request, once admitted (the leader's, then everyone's)
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

    # -- 1. admission (the leader) ------------------------------------------------------------
    def admit(self, n: Optional[int], window: float):
        offers = Offers(self.rdv.store, self.job, self.rdv.prefix)
        nonces = {}
        until = time.monotonic() + window

        def poll():
            self.relay()
            self.watch()

        def gone(req) -> bool:  # a joiner on this host that died before it accepted: passed over
            return req["host"] == self.here and process_gone(req["pid"])

        def enough() -> bool:
            return n is not None and len(self.joiners) >= n

        def taken() -> bool:
            while not enough():
                got = offers.take(poll, gone)
                if got is None:
                    return n is None and time.monotonic() > until and bool(self.joiners)
                t, nonce, req = got
                if nonce:
                    offers.admitted(t)
                    self.joiners[t], nonces[t] = req, nonce
                    self._check(t, req)
            return True

        def too_few():
            asked = f"{len(self.joiners)} asked" if n is not None else "none asked"
            return self.fail(RendezvousError(
                f"{self.what}: waited {window:g} s for {n if n is not None else 'any'} process(es) to "
                f"join job {self.job!r} (commlib.join), {asked}"))

        wait_until(taken, until, poll=poll, max_pause=MAX_PAUSE_S, on_timeout=too_few)
        self.rdv.set("decision", json.dumps({"size": self.size, "joiners": [
            {"slot": t, "nonce": nonces[t], "request": self.joiners[t]} for t in sorted(self.joiners)]}))

    def _check(self, t: int, req: dict):
        """Joiner #t (admitted) against this job: another version or setting fails the grow."""
        wrong = mismatch(identity(), req)
        if wrong:
            self.fail(RendezvousError(f"{self.what}: refused joiner #{t} (pid {req['pid']} on {req['host']}): "
                                      f"it has {wrong}"))

    # -- 2. decision (everyone else) ----------------------------------------------------------------
    def await_decision(self, window: float):
        # the leader's window, its last accept wait, then ours
        self.rdv.deadline = time.monotonic() + window + ACCEPT_WAIT_S + self.rdv.timeout
        key = f"{self.rdv.prefix}/decision"
        wait_until(lambda: self.rdv.store.check([key]), None, on_timeout=RendezvousError,
                   poll=self._watch_decision, max_pause=MAX_PAUSE_S)
        decision = _parse_decision(self.rdv.store.get(key))
        if decision is None:
            self.fail(RendezvousError(f"{self.what}: the decision in the store is malformed"))
        self.joiners = {t: req for t, _, req in decision[1]}

    def _watch_decision(self):
        self.relay()
        self.watch()
        self._waited_too_long([0], "decide who joins")

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
        """The grown communicator's ``ranks``, joiners named by their slot and pid."""
        slots = sorted(self.joiners)
        names = [f"rank {r}" if r < self.size else
                 f"rank {r} (joiner #{slots[r - self.size]}, pid {self.joiners[slots[r - self.size]]['pid']})"
                 for r in sorted(ranks)]
        return ", ".join(names) + " of the grown communicator"


def grow(comm, n: Optional[int], k: int, timeout: float, window: float, rendezvous, create):
    """Implementation of Communicator.grow (collective over ``comm``): ``n`` joiners (None: those
    that asked within ``window`` seconds, at least one). ``rendezvous`` and ``create`` are
    commlib.init's (passed in, so this module sits below commlib.init)."""
    g = _Grow(comm, k, timeout, rendezvous)
    if g.me == 0:
        g.admit(n, window)
    else:
        g.await_decision(window)
    return g.build(create)


class _Joiner:
    """A joiner's side: its request, then the grow whose offer it accepted (``rdv`` from then)."""

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

    def _no_grow(self):
        return RendezvousError(
            f"join: waited {self.timeout:g} s for a grow of job {self.job!r} to admit this process "
            f"(no member called comm.grow(); keys under {self.job + '/join'!r})")

    def admitted(self, rendezvous):
        """(rank, size) in the grown communicator once a grow listed this joiner's accept in its
        decision; a joiner accepted too late asks again, until its timeout."""
        deadline = time.monotonic() + self.timeout
        asking = Asking(self.store, self.job, identity())
        while True:
            slot, offer = asking.offer(deadline, self._no_grow)
            self.rdv = rendezvous(self.store, offer["grow"], -1, self.timeout)
            phases.reached(self.rdv.prefix, "admitted")
            decision = _parse_decision(self.rdv.wait("decision", "the grow's leader to decide who joins"))
            if decision is None:
                raise RendezvousError(f"join {self.rdv.prefix!r}: the decision in the store is malformed")
            size_before, admitted = decision
            mine = [k for k, (t, nonce, _) in enumerate(admitted) if t == slot and nonce == offer["nonce"]]
            if mine:
                return size_before + mine[0], size_before + len(admitted)
            if time.monotonic() > deadline:
                raise self._no_grow()

    def build(self, rendezvous, create):
        try:
            rank, size = self.admitted(rendezvous)
            self.rdv.rank = rank
            self.rdv.deadline = time.monotonic() + self.timeout
            new = create(self.store, self.rdv.prefix, rank, size, self.timeout)
        except CommError as exc:
            if self.rdv is not None:
                self.relay()
            raise (PeerError(str(exc)) if DIED in str(exc) else exc) from None
        await_all_built(self, rank, range(new.size), new, lambda: gone_ranks(new, ("dead",)), self.died)
        return new


def join(store, job: str, timeout: float, rendezvous, create):
    """Implementation of commlib.join: ask to join ``job`` through ``store``; the grown
    communicator once a grow admitted this process and everyone built it."""
    return _Joiner(secured(store), job, timeout).build(rendezvous, create)


__all__ = ["SHARED_SETTINGS", "grow", "identity", "join", "mismatch"]
