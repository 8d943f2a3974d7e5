"""Communicator.shrink: the survivors of a failure agree on who is gone, then build a smaller
communicator of themselves (ranks renumbered in order) through the same store.

Agreement, under ``<prefix>/shrink<n>`` (n counts this communicator's shrinks, the same on every
survivor since each calls shrink once per attempt):

1. Claims. Each caller publishes the ranks it excludes (the ones given, or with ``exclude=None``
   the ones it sees gone now: process dead on this host, connection lost across hosts, or closed)
   and, as evidence, those of them it sees gone. It then waits until every rank that nobody claims
   has published its claim.
2. Checks, on every caller, from the published claims alone (so all decide alike), each naming the
   ranks at fault: nobody excludes a rank that called shrink (unless a claimer saw it gone since:
   it died during the shrink); an explicit ``exclude`` equals the union of all claims; every
   excluded rank was seen gone by some claimer, so a rank whose links saw no failure yet takes the
   others' word instead of ending up elsewhere.
3. Decision. Each publishes the union it decided on and compares it with every survivor's.
4. The survivors build the new communicator under the same prefix, so an error reported by any
   rank at any step (``<prefix>/error``) fails every other rank at once.
5. Commit. Each says it built it (``built/<rank>``) and waits until every survivor did: shrink
   returns the new communicator on every survivor or on none.

While waiting, each rank watches the survivors through the old communicator's links, and the
error key. A failure at any step, however a rank learns of it (its own watch, another's report, a
socket reset, a descriptor that never came), is settled alike on every rank (``settle``): each
says it failed and waits for every rank of the attempt to say so too or to be seen gone; one gone
without saying so died during the shrink, and every survivor raises PeerError naming the same
ranks (call shrink again: they are excluded too); else every survivor raises RendezvousError. One
that dies after saying it built the new communicator is that communicator's to report, at its next
call. Nothing here waits much longer than the timeout. ``commlib.bootstrap.phases`` names the
steps, where tests kill a rank.
"""
from __future__ import annotations

import json
import time
from typing import Iterable, Optional, Set

from commlib.bootstrap import phases
from commlib.bootstrap.wait import wait_until
from commlib.core.call_checks import as_ranks
from commlib.core.rebuild import MAX_PAUSE_S, RebuildAgreement, await_all_built
from commlib.errors import CommError, PeerError, RendezvousError

# A peer in one of these states takes no further part: its process or connection is gone, or it
# closed the communicator.
GONE_STATES = ("dead", "closed")
# How long a caller of shrink(exclude=[...]) waits for its own links to see a named rank gone
# before it publishes what it saw (a rank that no claimer sees gone is not excluded).
CONFIRM_GRACE_S = 2.0
# The least time a failed rank waits for the others of the attempt to say they failed too (or to
# be seen gone), even when the attempt's deadline is near: a death across hosts is seen by a lost
# connection, which takes a moment.
SETTLE_S = 10.0
DIED = "died during the shrink"


def process_gone(pid: int) -> bool:
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
        if state in states or (kinds[r] == "shm" and process_gone(pid)):
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


class _Agreement(RebuildAgreement):
    """One rank's side of shrink #n over ``comm`` (see the module docstring). ``fail`` reports and
    raises, ``relay`` raises another's report: ``settle`` then decides the class every survivor
    raises."""

    waiting_hint = " (alive but not calling shrink?)"

    def __init__(self, comm, exclude: Optional[list], n: int, timeout: float, rendezvous):
        super().__init__(comm, "shrink", n, timeout, rendezvous)
        self.explicit = exclude is not None
        self.claim = set(exclude) if self.explicit else gone_ranks(comm)
        self.survivors = None  # old ranks of the new communicator, once decided

    def _read(self, key: str, rank: int) -> Optional[dict]:
        full = f"{self.rdv.prefix}/{key}/{rank}"
        if not self.rdv.store.check([full]):
            return None
        raw = self.rdv.store.get(full)
        try:
            rec = json.loads(bytes(raw).decode())
            ranks, explicit, gone = rec["exclude"], rec["explicit"], rec["gone"]
            good = isinstance(explicit, bool) and all(isinstance(x, list) and all(
                isinstance(r, int) and not isinstance(r, bool) and 0 <= r < self.size for r in x) for x in (ranks, gone))
        except (ValueError, TypeError, KeyError):  # not JSON, not an object, a field missing
            good = False
        if not good:
            self.fail(RendezvousError(f"{self.what}: rank {rank}'s {key} is malformed: {bytes(raw)[:80]!r}"))
        return rec

    def _wait(self, ready, poll, waited_for, step: str):
        """Until ``ready()``, ``poll()`` every round (it raises what failed); past the deadline, fail
        naming the ranks ``waited_for()`` has not seen ``step``."""
        wait_until(ready, self.rdv.deadline, poll=poll, max_pause=MAX_PAUSE_S,
                   on_timeout=lambda: self._waited_too_long(waited_for(), step))

    def died_during_shrink(self, ranks):
        self.fail(PeerError(f"{self.what}: rank(s) {_fmt(ranks)} {DIED} (rank {self.me} "
                            f"saw it); call shrink again to exclude them too"))

    # -- 1. claims -------------------------------------------------------------------------------
    def collect_claims(self) -> dict:
        if self.me in self.claim:
            self.fail(RendezvousError(f"{self.what}: rank {self.me} called shrink but excludes itself "
                                      f"(exclude={_fmt(self.claim)}): an excluded rank must not call shrink"))
        seen = self.evidence()
        self.rdv.set(f"claim/{self.me}", json.dumps({"exclude": sorted(self.claim), "explicit": self.explicit,
                                                     "gone": sorted(seen)}))
        phases.reached(self.rdv.prefix, "claimed")
        self.relay()  # what another rank reported while this one gathered its evidence comes first
        claims = {self.me: (self.claim, self.explicit)}
        self.seen_gone = {self.me: seen}  # every claimer's evidence: the ranks it saw gone
        pending, gone = [], set()

        def all_claimed() -> bool:
            nonlocal pending
            for s in range(self.size):
                if s not in claims:
                    rec = self._read("claim", s)
                    if rec is not None:
                        claims[s] = (set(rec["exclude"]), rec["explicit"])
                        self.seen_gone[s] = set(rec["gone"])
            claimed = set().union(*(c for c, _ in claims.values()))
            pending = [s for s in range(self.size) if s not in claims and s not in claimed]
            return not pending

        def watch_pending():
            nonlocal gone
            self.relay()
            gone = gone_ranks(self.comm)
            if all(s in gone for s in pending):  # every live rank claimed, and nobody claims these
                self.died_during_shrink(pending)

        self._wait(all_claimed, watch_pending, lambda: [s for s in pending if s not in gone], "call shrink")
        return claims

    # -- 2. checks ---------------------------------------------------------------------------------
    def check_claims(self, claims: dict) -> Set[int]:
        union = set().union(*(c for c, _ in claims.values()))
        by = {x: sorted(s for s, (c, _) in claims.items() if x in c) for x in union}
        called = sorted(x for x in union if x in claims)
        seen = set().union(*self.seen_gone.values())  # gone as some claimer saw it
        if called:
            # A rank that published its claim and that a claimer then saw gone died during the
            # shrink (settle confirms it: it never says it saw the failure), not a live rank excluded.
            dead = [x for x in called if x in seen]
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
        # Decided from the published evidence alone, so every survivor decides alike: a rank is
        # gone when any claimer saw it gone (its own links, when it published its claim).
        unconfirmed = union - seen
        if unconfirmed:
            x = min(unconfirmed)
            state, pid, _ = self.comm._core.peer_states()[x]
            self.fail(RendezvousError(
                f"{self.what}: rank(s) {_fmt(by[x])} exclude rank {x}, but no survivor sees it gone (rank "
                f"{self.me} sees it alive: pid {pid}, link {state}): shrink excludes only ranks that died"))
        return union

    def evidence(self) -> Set[int]:
        """The ranks of this rank's claim it sees gone, published with the claim. A claim of its own
        (``exclude=None``) is only what it sees. Named ranks it does not see gone yet are given a
        grace (a lost connection across hosts may come a moment after the caller's word): a rank
        that no claimer sees gone is not excluded (check_claims). Nothing is raised here: every
        live rank publishes its claim before it may fail (``settle`` counts on it)."""
        seen = self.claim & gone_ranks(self.comm)
        until = time.monotonic() + min(CONFIRM_GRACE_S, self.rdv.timeout)
        while seen != self.claim and time.monotonic() < until:
            time.sleep(0.01)
            seen = self.claim & gone_ranks(self.comm)
        return seen

    # -- 3. decision -------------------------------------------------------------------------------
    def agree(self, excluded: Set[int]):
        self.rdv.set(f"final/{self.me}", json.dumps({"exclude": sorted(excluded), "explicit": self.explicit,
                                                     "gone": []}))
        phases.reached(self.rdv.prefix, "decided")
        self.survivors = [r for r in range(self.size) if r not in excluded]
        waiting = [r for r in self.survivors if r != self.me]

        def all_decided() -> bool:
            for s in list(waiting):
                rec = self._read("final", s)
                if rec is None:
                    continue
                waiting.remove(s)
                if set(rec["exclude"]) != excluded:
                    self.fail(RendezvousError(
                        f"{self.what}: survivors disagree on the excluded ranks: rank {self.me} decided "
                        f"{_fmt(excluded)}, rank {s} decided {_fmt(rec['exclude'])}"))
            return not waiting

        def relay_and_watch():
            self.relay()
            self.watch()

        self._wait(all_decided, relay_and_watch, lambda: waiting, "decide")

    # -- 4. the new communicator, and every survivor's word that it has it -------------------------
    def build(self, create):
        """The survivors' communicator. Whatever ends its rendezvous (this rank's own watch, a
        relayed report, a reset socket, a fd that never came) is settled as every failure is."""
        new = create(self.comm._store, self.rdv.prefix, self.survivors.index(self.me), len(self.survivors),
                     self.rdv.timeout, check=self.watch)
        phases.reached(self.rdv.prefix, "built")
        return new

    def commit(self, new):
        """Return once every survivor built ``new``; else close it and raise what failed, the same
        on every survivor: nobody goes on with the new communicator unless all do. A survivor that
        died after saying it built it does not fail the shrink (the new communicator's next call
        names it); one that died before did."""
        await_all_built(self, self.me, self.survivors, new,
                        lambda: gone_ranks(self.comm, ("dead",)), self.died_during_shrink)

    def watch(self):
        """PeerError on every rank when a survivor died while the shrink runs. Only deaths count:
        a survivor done with the shrink may close the old communicator already."""
        dead = [r for r in gone_ranks(self.comm, ("dead",)) if r in self.survivors]
        if dead:
            self.died_during_shrink(dead)


    # -- a failure, settled alike on every survivor ------------------------------------------------
    def settle(self, exc: Exception):
        """Raise the error every survivor raises for ``exc``, this rank's failure of the attempt
        (its own, or another rank's report). The class is decided from evidence every survivor
        reads alike, never from how soon this rank's links noticed something: each failing rank
        reports its error, then says it failed (``failed/<rank>``), then waits until every rank of
        the attempt said so too or is gone as it sees it (dead or closed). The ranks of the attempt:
        those that published a claim, and those no published claim excludes (every live one of
        them publishes its claim before it fails). Those gone without having said so died during
        the shrink: PeerError naming them, the same ranks on every survivor (a rank that said so
        and then died said it first: its word is read again once it is seen gone). Else nobody
        died: RendezvousError. Bounded: past the deadline (at least SETTLE_S from now) a rank that
        neither said so nor is gone is taken as alive (it hangs, or never called shrink)."""
        store, prefix = self.rdv.store, self.rdv.prefix
        try:
            if not store.check([f"{prefix}/error"]):
                self.rdv.report(str(exc))
            self.rdv.set(f"failed/{self.me}", b"1")
        except (CommError, OSError):  # the store is lost (StoreLostError on every rank alike)
            raise exc from None
        if not isinstance(exc, CommError):  # e.g. a ValueError naming a bad setting, raised as it is
            raise exc
        said = lambda r: store.check([f"{prefix}/failed/{r}"])  # noqa: E731
        deadline = max(self.rdv.deadline, time.monotonic() + min(self.rdv.timeout, SETTLE_S))
        claims, settled, left = {}, {self.me}, set()
        pause = 0.001
        while True:
            for r in range(self.size):
                if r not in claims and store.check([f"{prefix}/claim/{r}"]):
                    claims[r] = self._excluded_by(r)
            excluded = set().union(*claims.values())
            members = {r for r in range(self.size) if r in claims or r not in excluded}
            gone = gone_ranks(self.comm)
            for r in sorted(members - settled):
                if said(r):
                    settled.add(r)
                elif r in gone:
                    if not said(r):  # read again after seeing it gone: its word, if given, came before
                        left.add(r)
                    settled.add(r)
            if members <= settled or time.monotonic() > deadline:
                break
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_S)
        left &= members
        if left:
            raise PeerError(f"{self.what}: rank(s) {_fmt(left)} {DIED} (rank {self.me} saw it); call shrink "
                            f"again to exclude them too") from None
        if isinstance(exc, RendezvousError):
            raise exc
        raise RendezvousError(str(exc)) from exc

    def _excluded_by(self, rank: int) -> Set[int]:
        """The ranks ``rank``'s published claim excludes (none if it is malformed: checked elsewhere)."""
        try:
            ranks = json.loads(bytes(self.rdv.store.get(f"{self.rdv.prefix}/claim/{rank}")).decode())["exclude"]
            return {r for r in ranks if isinstance(r, int)}
        except (ValueError, TypeError, KeyError):
            return set()


def shrink(comm, exclude: Optional[list], n: int, timeout: float, rendezvous, create):
    """Implementation of Communicator.shrink (collective over the survivors of ``comm``).

    ``rendezvous`` and ``create`` are commlib.init's rendezvous class and communicator builder
    (passed in, so this module sits below commlib.init)."""
    agreement = _Agreement(comm, exclude, n, timeout, rendezvous)
    try:
        excluded = agreement.check_claims(agreement.collect_claims())
        agreement.agree(excluded)
        new = agreement.build(create)
        agreement.commit(new)
    except Exception as exc:  # noqa: BLE001 - settled, then raised (or the class all survivors raise)
        agreement.settle(exc)
    return new


__all__ = ["check_exclude", "gone_ranks", "process_gone", "shrink"]
