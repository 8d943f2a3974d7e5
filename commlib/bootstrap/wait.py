"""The one rendezvous wait loop: a store key awaited with a deadline, a backing-off pause, and an
error key any rank may set to fail the others at once. ``commlib.init``'s rendezvous, the stream
engine's set-up (core/device_route.py) and the NCCL communicator's set-up (device/nccl_comm.py)
wait through it, each raising its own error type."""
from __future__ import annotations

import re
import time
from typing import Callable, Optional


def error_text(value) -> str:
    """A reported error as text, cut to 2000 bytes (a peer writes it; keep messages bounded)."""
    return bytes(value)[:2000].decode("utf-8", errors="replace")


def report(rank: int, error: BaseException) -> str:
    """The text a rank publishes under an error key when its set-up fails: ``rank N: Class: message``."""
    return f"rank {rank}: {type(error).__name__}: {error}"


_REPORT = re.compile(r"rank (\d+): (\w+): (.*)", re.S)


def reported_failure(why: str, rank: int, otherwise: Callable[[str], Exception]) -> Exception:
    """The exception rank ``rank`` raises for another rank's published failure ``why`` (see
    report). A dead peer is a PeerError wherever it was seen first: the rank that saw it reports
    ``PeerError: <collective>: ... rank R is gone``, and the others raise the same class with the
    same message (it names the collective and the dead rank), plus who reported it. Whether this
    rank's own peer check or the report comes first is a race, so both must give the same error.
    Anything else is ``otherwise(why)``. Only the class is taken from the report, never code, and
    the text is already bounded (error_text)."""
    m = _REPORT.fullmatch(why)
    if m and m.group(2) == "PeerError":
        from commlib.errors import PeerError
        return PeerError(f"{m.group(3)} (reported to rank {rank} by rank {m.group(1)})")
    return otherwise(why)


def wait_for_key(store, key: str, deadline: float, *, on_timeout: Callable[[], Exception],
                 error_key: str = "", on_error: Optional[Callable[[str], Exception]] = None,
                 poll: Optional[Callable[[], None]] = None) -> bytes:
    """The value of ``key`` once some rank set it. Until then, every round: ``poll()`` (it may
    raise), then the exception ``on_error(text)`` if ``error_key`` is set, then ``on_timeout()``
    once ``time.monotonic()`` passes ``deadline``; the pause between rounds grows from 0.5 ms to
    20 ms (a fast peer is seen at once, a slow one costs the store little)."""
    pause = 0.0005
    while not store.check([key]):
        if poll is not None:
            poll()
        if error_key and store.check([error_key]):
            raise on_error(error_text(store.get(error_key)))
        if time.monotonic() > deadline:
            raise on_timeout()
        time.sleep(pause)
        pause = min(pause * 2, 0.02)
    return bytes(store.get(key))
