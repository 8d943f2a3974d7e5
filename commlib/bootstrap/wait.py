"""The one store wait loop (``wait_until``): a condition polled with a deadline and a backing-off
pause. ``wait_for_key`` is it for one key, with an error key any rank may set to fail the others at
once: ``commlib.init``'s rendezvous, the stream engine's set-up (core/device_route.py) and the NCCL
communicator's set-up (device/nccl_comm.py) wait through it, each raising its own error type. The
device route's closing barrier (core/device_close.py) and shrink's agreement (core/shrink.py) call
``wait_until`` with their own conditions."""
from __future__ import annotations

import re
import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

# The first pause between two rounds of a wait, doubled every round up to the cap: a fast peer is
# seen at once, a slow one costs the store little.
FIRST_PAUSE_S = 0.0005
MAX_PAUSE_S = 0.02


def wait_until(ready: Callable[[], T], deadline: Optional[float], *,
               on_timeout: Callable[[], BaseException],
               poll: Optional[Callable[[], None]] = None, max_pause: float = MAX_PAUSE_S) -> T:
    """The first true value ``ready()`` returns. Every round until then: ``poll()`` (it may raise,
    to end the wait with an error), then, once ``time.monotonic()`` passes ``deadline`` (None:
    never), the exception ``on_timeout()`` returns is raised (it may also raise its own); then a
    pause that grows from FIRST_PAUSE_S to ``max_pause``."""
    pause = FIRST_PAUSE_S
    while True:
        value = ready()
        if value:
            return value
        if poll is not None:
            poll()
        if deadline is not None and time.monotonic() > deadline:
            raise on_timeout()
        time.sleep(pause)
        pause = min(pause * 2, max_pause)


def error_text(value) -> str:
    """A reported error as text, cut to 2000 bytes (a peer writes it; keep messages bounded)."""
    return bytes(value)[:2000].decode("utf-8", errors="replace")


def report(rank: int, error: BaseException) -> str:
    """The text a rank publishes under an error key when its set-up fails: ``rank N: Class: message``."""
    return f"rank {rank}: {type(error).__name__}: {error}"


_REPORT = re.compile(r"rank (\d+): (\w+): (.*)", re.S)


def reported_failure(why: str, rank: int, otherwise: Callable[[str], Exception]) -> Exception:
    """The exception rank ``rank`` raises for another rank's published failure ``why`` (see
    report). A dead peer is a PeerError wherever it was seen first (a mismatch a MismatchError,
    alike): the rank that saw it reports
    ``PeerError: <collective>: ... rank R is gone``, and the others raise the same class with the
    same message (it names the collective and the dead rank), plus who reported it. Whether this
    rank's own peer check or the report comes first is a race, so both must give the same error.
    Anything else is ``otherwise(why)``. Only the class is taken from the report, never code, and
    the text is already bounded (error_text)."""
    m = _REPORT.fullmatch(why)
    if m and m.group(2) in ("PeerError", "MismatchError"):
        # A mismatch is one event too: the rank that checked the descriptors first reports it, and
        # every rank raises the same class whichever saw it first (a race).
        from commlib.errors import MismatchError, PeerError
        cls = PeerError if m.group(2) == "PeerError" else MismatchError
        return cls(f"{m.group(3)} (reported to rank {rank} by rank {m.group(1)})")
    return otherwise(why)


def wait_for_key(store, key: str, deadline: float, *, on_timeout: Callable[[], Exception],
                 error_key: str = "", on_error: Optional[Callable[[str], Exception]] = None,
                 poll: Optional[Callable[[], None]] = None) -> bytes:
    """The value of ``key`` once some rank set it (``wait_until``). Until then, every round:
    ``poll()`` (it may raise), then the exception ``on_error(text)`` if ``error_key`` is set, then
    ``on_timeout()`` once ``time.monotonic()`` passes ``deadline``."""
    def poll_and_check_error():
        if poll is not None:
            poll()
        if error_key and store.check([error_key]):
            raise on_error(error_text(store.get(error_key)))

    wait_until(lambda: store.check([key]), deadline, on_timeout=on_timeout, poll=poll_and_check_error)
    return bytes(store.get(key))
