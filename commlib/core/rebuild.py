"""What a shrink's and a grow's agreements share (commlib/core/shrink.py, commlib/core/grow.py).

``RebuildAgreement`` is one member's side of an agreement under ``<prefix>/<kind><n>`` of a
communicator, kept in the store it was built on: a failure is reported under the error key before
it is raised (``fail``), so every other rank's next wait raises it too (``relay``); a wait past the
deadline names the ranks that did not come (``_waited_too_long``). ``await_all_built`` is the
commit step both end with (a joiner's side uses it too): every rank says it built the new
communicator and waits until all did, so the new communicator exists on every rank or on none.
How a failure is classed (a death or not) is each agreement's own."""
from __future__ import annotations

import time

from commlib.bootstrap import phases
from commlib.bootstrap.wait import wait_until
from commlib.errors import CommError, RendezvousError

# The longest pause between two rounds of a wait of an agreement: each round also watches the
# other ranks, so a death is seen within it.
MAX_PAUSE_S = 0.01


class RebuildAgreement:
    """One member's side of ``<kind>`` #n over ``comm`` (``kind``: "shrink" or "grow")."""

    # Said after the ranks a member waited for in vain (why they may not have come).
    waiting_hint = ""

    def __init__(self, comm, kind: str, n: int, timeout: float, rendezvous):
        self.comm = comm
        self.me, self.size = comm.rank, comm.size
        self.what = f"{kind} #{n} of {comm._prefix!r}"
        self.rdv = rendezvous(comm._store, f"{comm._prefix}/{kind}{n}", self.me, timeout)

    def fail(self, exc: CommError):
        """Report ``exc`` to every rank of the agreement, then raise it here."""
        self.rdv.report(str(exc))
        raise exc

    def relay(self):
        """Raise what another rank reported (RendezvousError), if any."""
        self.rdv.raise_reported()

    def _waited_too_long(self, ranks, step: str):
        if time.monotonic() > self.rdv.deadline:
            self.fail(RendezvousError(f"{self.what}: rank {self.me} waited {self.rdv.timeout:g} s for rank(s) "
                                      f"{sorted(ranks)} to {step}{self.waiting_hint}"))


def await_all_built(agreement, me: int, members, new, dead_now, died):
    """The commit step of a shrink or a grow: say this rank (``me``, its number among ``members``
    as named in the store) built ``new`` (``built/<me>`` under the agreement's prefix), then wait
    until every member did. ``dead_now()`` gives the members seen dead, ``died(ranks)`` fails the
    agreement on every rank for them; ``agreement`` gives ``rdv``, ``relay()`` and
    ``_waited_too_long(ranks, step)``. On any failure ``new`` is closed before the error rises."""
    rdv = agreement.rdv
    built = lambda r: rdv.store.check([f"{rdv.prefix}/built/{r}"])  # noqa: E731
    rdv.deadline = time.monotonic() + rdv.timeout  # the building had a timeout of its own
    try:
        rdv.set(f"built/{me}", b"1")
        phases.reached(rdv.prefix, "committed")
        waiting = [r for r in members if r != me]

        def all_built() -> bool:
            waiting[:] = [r for r in waiting if not built(r)]
            return not waiting

        def watch_waiting():
            agreement.relay()
            # read again after seeing the death: its word, if given, came before it
            dead = [r for r in dead_now() if r in waiting and not built(r)]
            if dead:
                died(dead)

        wait_until(all_built, rdv.deadline, poll=watch_waiting, max_pause=MAX_PAUSE_S,
                   on_timeout=lambda: agreement._waited_too_long(waiting, "build the new communicator"))
    except BaseException:
        new.close()
        raise


__all__ = ["MAX_PAUSE_S", "RebuildAgreement", "await_all_built"]
