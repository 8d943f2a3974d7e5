"""The handle of an asynchronous call, shared by the host communicator (commlib/core/communicator.py) and
the stream engine's device calls (commlib/core/device_route.py), so neither imports the other for it."""
from __future__ import annotations

from typing import Optional

from commlib.core.call_checks import as_seconds


class Work:
    """Handle of an asynchronous call. Calls on one communicator complete in call order.

    ``wait()`` blocks (GIL released) until done and re-raises the call's error, if any;
    ``is_completed()`` polls. The handle keeps the call's buffers alive until it completes.
    """

    __slots__ = ("_work", "_refs")

    def __init__(self, work, refs):
        self._work = work
        self._refs = refs

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the call completes; raise its CommError if it failed.

        With ``timeout`` (seconds), return False if it has not completed by then.
        """
        timeout = as_seconds(timeout, allow_zero=True)
        if not self._work.wait(-1.0 if timeout is None else timeout):
            return False
        self._refs = None
        return True

    def is_completed(self) -> bool:
        """True once the call finished (successfully or not); never blocks."""
        return self._work.is_completed()

    def exception(self):
        """The call's error once completed, else None."""
        if not self._work.is_completed():
            return None
        try:
            self._raise_error()
        except Exception as e:  # noqa: BLE001 - returned, not raised
            return e
        return None

    def _raise_error(self):
        """Raise the completed call's error, if any (device works override it)."""
        self._work.wait(0.0)
