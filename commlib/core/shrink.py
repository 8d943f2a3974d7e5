"""Communicator.shrink: the survivors of a failure agree on who is gone, then build a smaller
communicator of themselves (ranks renumbered in order) through the same store.

Agreement, under ``<prefix>/shrink<n>`` (n counts this communicator's shrinks, the same on every
survivor since each calls shrink once per attempt):

1. Claims. Each caller publishes the ranks it excludes: the ones given, or (``exclude=None``) the
   ones this rank sees gone now (process dead on this host, connection lost across hosts, or
   closed). It then waits until every rank that nobody claims has published its claim.
2. Checks, on every caller, each naming the ranks at fault: nobody excludes a rank that called
   shrink (it is alive, and an excluded rank must not call shrink); an explicit ``exclude`` equals
   the union of all claims; every excluded rank is gone as this rank sees it (after a short grace
   for a link to notice), so a rank that saw no failure yet confirms the others' claims instead of
   ending up elsewhere.
3. Decision. Each publishes the union it decided on and compares it with every survivor's.
4. The survivors build the new communicator under the same prefix, so an error reported by any
   rank at any step (``<prefix>/error``) fails every other rank at once.
5. Commit. Each says it built it (``built/<rank>``) and waits until every survivor did: shrink
   returns the new communicator on every survivor or on none.

While waiting, each rank watches the survivors through the old communicator's links: one that dies
during the shrink, at any step, fails it on every rank with PeerError naming it (call shrink again
to exclude it too), however each rank learns of it (its own watch, another's report, a socket
reset or a descriptor that never came while building). One that dies after saying it built the new
communicator is that communicator's to report, at its next call. Nothing here waits longer than the
timeout. ``commlib.bootstrap.phases`` names the steps, where tests kill a rank.
"""
from __future__ import annotations

import json
import time
from typing import Iterable, Optional, Set

from commlib.bootstrap import phases
from commlib.core.call_checks import as_ranks
from commlib.errors import CommError, PeerError, RendezvousError

# A peer in one of these states takes no further part: its process or connection is gone, or it
# closed the communicator.
GONE_STATES = ("dead", "closed")
# How long a rank waits for its own links to confirm a death that another rank claims.
CONFIRM_GRACE_S = 2.0
DIED = "died during the shrink"


def _process_gone(pid: int) -> bool:
    """True when ``pid`` (a process on this host) no longer runs (absent or a zombie)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True
    state = stat[stat.rfind(")") + 2:stat.rfind(")") + 3]
    return state in ("Z", "X")


def gone_ranks(comm, states=GONE_STATES) -> Set[int]:
    """The ranks of ``comm`` this rank sees in one of ``states`` now (default: dead or closed). A
    peer on this host that published an error and then died is caught by its process, whatever
    its last state (the core does the same for links across hosts)."""
    return gone_peers(comm._core, states)


def gone_peers(core, states=GONE_STATES) -> Set[int]:
    """``gone_ranks`` of a C++ communicator (``_C.Communicator``): the device route's closing
    barrier asks it, which sees its communicator only as a RouteContext."""
    gone = set()
    kinds = core.link_kinds
    for r, (state, pid, _msg) in enumerate(core.peer_states()):
        if state in states or (kinds[r] == "shm" and _process_gone(pid)):
            gone.add(r)
    return gone


def check_exclude(exclude, size: int, name: str = "exclude") -> Optional[list]:
    """``exclude`` as a sorted list of ranks (None stays None): each one a rank as every call
    takes it (anything with ``__index__``, commlib.core.call_checks.as_rank); errors name the
    argument."""
    if exclude is None:
        return None
    ranks = as_ranks(exclude, name, size)
    if len(ranks) >= size:
        raise ValueError(f"{name}: {sorted(ranks)} leaves no rank of {size}")
    return sorted(ranks)


def _fmt(ranks: Iterable[int]) -> str:
    return "[" + ", ".join(str(r) for r in sorted(ranks)) + "]"


class _Agreement:
    """One rank's side of shrink #n over ``comm`` (see the module docstring)."""

    def __init__(self, comm, exclude: Optional[list], n: int, timeout: float, rendezvous):
        self.comm = comm
        self.me, self.size = comm.rank, comm.size
        self.what = f"shrink #{n} of {comm._prefix!r}"
        self.rdv = rendezvous(comm._store, f"{comm._prefix}/shrink{n}", self.me, timeout)
        self.explicit = exclude is not None
        self.claim = set(exclude) if self.explicit else gone_ranks(comm)
        self.survivors = None  # old ranks of the new communicator, once decided

    def fail(self, exc: CommError):
        """Report ``exc`` to every rank of the shrink, then raise it here."""
        self.rdv.report(str(exc))
        raise exc

    def relay(self):
        """Raise what another rank reported: a death during the shrink stays a PeerError."""
        try:
            self.rdv.raise_reported()
        except RendezvousError as exc:
            self.raise_as_death(exc)

    def raise_as_death(self, exc: CommError):
        """Raise ``exc``, or the death it comes from: a survivor seen dead (once the survivors are
        decided), or another rank's report of one, is a PeerError on every survivor alike, whatever
        step noticed it and however (this rank's watch, a relayed report, a reset socket)."""
        if isinstance(exc, PeerError) and DIED in str(exc):
            raise exc
        if self.survivors is not None:
            dead = self.seen_dead([r for r in self.survivors if r != self.me])
            if dead:
                self.died_during_shrink(dead)
        if DIED in str(exc):  # another survivor's report of a death this rank has not seen
            raise PeerError(str(exc)) from None
        raise exc

    def _read(self, key: str, rank: int) -> Optional[dict]:
        full = f"{self.rdv.prefix}/{key}/{rank}"
        if not self.rdv.store.check([full]):
            return None
        raw = self.rdv.store.get(full)
        try:
            rec = json.loads(bytes(raw).decode())
            ranks, explicit = rec["exclude"], rec["explicit"]
            good = isinstance(ranks, list) and isinstance(explicit, bool) and all(
                isinstance(r, int) and not isinstance(r, bool) and 0 <= r < self.size for r in ranks)
        except (ValueError, TypeError, KeyError):  # not JSON, not an object, a field missing
            good = False
        if not good:
            self.fail(RendezvousError(f"{self.what}: rank {rank}'s {key} is malformed: {bytes(raw)[:80]!r}"))
        return rec

    def _waited_too_long(self, ranks, step: str):
        if time.monotonic() > self.rdv.deadline:
            self.fail(RendezvousError(
                f"{self.what}: rank {self.me} waited {self.rdv.timeout:g} s for rank(s) {_fmt(ranks)} "
                f"to {step} (alive but not calling shrink?)"))

    def died_during_shrink(self, ranks):
        self.fail(PeerError(f"{self.what}: rank(s) {_fmt(ranks)} {DIED} (rank {self.me} "
                            f"saw it); call shrink again to exclude them too"))

    # -- 1. claims -------------------------------------------------------------------------------
    def collect_claims(self) -> dict:
        if self.me in self.claim:
            self.fail(RendezvousError(f"{self.what}: rank {self.me} called shrink but excludes itself "
                                      f"(exclude={_fmt(self.claim)}): an excluded rank must not call shrink"))
        self.rdv.set(f"claim/{self.me}", json.dumps({"exclude": sorted(self.claim), "explicit": self.explicit}))
        phases.reached(self.rdv.prefix, "claimed")
        claims = {self.me: (self.claim, self.explicit)}
        pause = 0.0005
        while True:
            for s in range(self.size):
                if s not in claims:
                    rec = self._read("claim", s)
                    if rec is not None:
                        claims[s] = (set(rec["exclude"]), rec["explicit"])
            claimed = set().union(*(c for c, _ in claims.values()))
            pending = [s for s in range(self.size) if s not in claims and s not in claimed]
            if not pending:
                return claims
            self.relay()
            gone = gone_ranks(self.comm)
            if all(s in gone for s in pending):  # every live rank claimed, and nobody claims these
                self.died_during_shrink(pending)
            self._waited_too_long([s for s in pending if s not in gone], "call shrink")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    # -- 2. checks ---------------------------------------------------------------------------------
    def check_claims(self, claims: dict) -> Set[int]:
        union = set().union(*(c for c, _ in claims.values()))
        by = {x: sorted(s for s, (c, _) in claims.items() if x in c) for x in union}
        called = sorted(x for x in union if x in claims)
        if called:
            # A rank that published its claim and then died is claimed by the survivors that saw
            # it gone: a death during the shrink, as everywhere else, not a live rank excluded.
            dead = self.seen_dead(called)
            if dead:
                self.died_during_shrink(dead)
            x = called[0]
            self.fail(RendezvousError(
                f"{self.what}: rank(s) {_fmt(by[x])} exclude rank {x}, which is alive: it called shrink "
                f"(rank {self.me} saw it)"))
        for s, (c, explicit) in sorted(claims.items()):
            if explicit and c != union:
                other = next(t for t, (d, _) in sorted(claims.items()) if d != c)
                self.fail(RendezvousError(
                    f"{self.what}: survivors disagree on the excluded ranks: rank {s} excludes {_fmt(c)}, "
                    f"rank {other} excludes {_fmt(claims[other][0])}"))
        unconfirmed = union - gone_ranks(self.comm)
        until = time.monotonic() + min(CONFIRM_GRACE_S, self.rdv.timeout)
        while unconfirmed and time.monotonic() < until:
            self.relay()
            time.sleep(0.01)
            unconfirmed -= gone_ranks(self.comm)
        if unconfirmed:
            x = min(unconfirmed)
            state, pid, _ = self.comm._core.peer_states()[x]
            self.fail(RendezvousError(
                f"{self.what}: rank(s) {_fmt(by[x])} exclude rank {x}, but rank {self.me} sees it alive "
                f"(pid {pid}, link {state}): shrink excludes only ranks that died; survivors disagree"))
        return union

    # -- 3. decision -------------------------------------------------------------------------------
    def agree(self, excluded: Set[int]):
        self.rdv.set(f"final/{self.me}", json.dumps({"exclude": sorted(excluded), "explicit": self.explicit}))
        phases.reached(self.rdv.prefix, "decided")
        self.survivors = [r for r in range(self.size) if r not in excluded]
        waiting = [r for r in self.survivors if r != self.me]
        pause = 0.0005
        while waiting:
            for s in list(waiting):
                rec = self._read("final", s)
                if rec is None:
                    continue
                waiting.remove(s)
                if set(rec["exclude"]) != excluded:
                    self.fail(RendezvousError(
                        f"{self.what}: survivors disagree on the excluded ranks: rank {self.me} decided "
                        f"{_fmt(excluded)}, rank {s} decided {_fmt(rec['exclude'])}"))
            if not waiting:
                break
            self.relay()
            self.watch()
            self._waited_too_long(waiting, "decide")
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def seen_dead(self, ranks) -> list:
        """Those of ``ranks`` this rank sees dead. A rank across hosts is known dead by its lost
        connection, which may come a moment after a peer's word: those are given the grace."""
        kinds = self.comm._core.link_kinds
        until = time.monotonic() + min(CONFIRM_GRACE_S, self.rdv.timeout)
        while True:
            dead = sorted(set(ranks) & gone_ranks(self.comm, ("dead",)))
            if dead or time.monotonic() >= until or not any(kinds[r] == "tcp" for r in ranks):
                return dead
            time.sleep(0.01)

    # -- 4. the new communicator, and every survivor's word that it has it -------------------------
    def build(self, create):
        """The survivors' communicator. Whatever ends its rendezvous (this rank's own watch, a
        relayed report, a reset socket, a fd that never came) while a survivor is dead is that
        death: PeerError naming it, on every survivor alike."""
        try:
            new = create(self.comm._store, self.rdv.prefix, self.survivors.index(self.me), len(self.survivors),
                         self.rdv.timeout, check=self.watch)
        except CommError as exc:
            self.raise_as_death(exc)
        phases.reached(self.rdv.prefix, "built")
        return new

    def commit(self, new):
        """Return once every survivor built ``new``; else close it and raise what failed, the same
        on every survivor: nobody goes on with the new communicator unless all do. A survivor that
        died after saying it built it does not fail the shrink (the new communicator's next call
        names it); one that died before did."""
        built = lambda r: self.rdv.store.check([f"{self.rdv.prefix}/built/{r}"])  # noqa: E731
        self.rdv.deadline = time.monotonic() + self.rdv.timeout  # the building had a timeout of its own
        try:
            self.rdv.set(f"built/{self.me}", b"1")
            phases.reached(self.rdv.prefix, "committed")
            waiting = [r for r in self.survivors if r != self.me]
            pause = 0.0005
            while True:
                waiting = [r for r in waiting if not built(r)]
                if not waiting:
                    return
                self.relay()
                # read again after seeing the death: its word, if given, came before it
                dead = [r for r in gone_ranks(self.comm, ("dead",)) if r in waiting and not built(r)]
                if dead:
                    self.died_during_shrink(dead)
                self._waited_too_long(waiting, "build the new communicator")
                time.sleep(pause)
                pause = min(pause * 2, 0.01)
        except BaseException:
            new.close()
            raise

    def watch(self):
        """PeerError on every rank when a survivor died while the shrink runs. Only deaths count:
        a survivor done with the shrink may close the old communicator already."""
        dead = [r for r in gone_ranks(self.comm, ("dead",)) if r in self.survivors]
        if dead:
            self.died_during_shrink(dead)


def shrink(comm, exclude: Optional[list], n: int, timeout: float, rendezvous, create):
    """Implementation of Communicator.shrink (collective over the survivors of ``comm``).

    ``rendezvous`` and ``create`` are commlib.init's rendezvous class and communicator builder
    (passed in, so this module sits below commlib.init)."""
    agreement = _Agreement(comm, exclude, n, timeout, rendezvous)
    excluded = agreement.check_claims(agreement.collect_claims())
    agreement.agree(excluded)
    new = agreement.build(create)
    agreement.commit(new)
    return new


__all__ = ["check_exclude", "gone_ranks", "shrink"]
