"""A communicator's failure, set and asked: ``abort()``, ``aborted`` and ``async_error()`` of
Communicator (CommunicatorFailure) and of its device route's stream engines (RouteFailure), apart
from the calls. ``async_error()`` is NCCL's ``ncclCommGetAsyncError``: what a caller asks where no
call of its own would tell it, as after a CUDA graph's replays, which have no work handle
(docs/gpu.md, "Stream capture and CUDA graphs")."""


class RouteFailure:
    """DeviceRoute's part: its engines (``self._engines``) aborted or asked."""

    def abort(self, reason):
        self._adopt_all()  # (engines a C++ caller set up abort too)
        self._fast_calls.forget()  # the buffers stay held: the streams may still run their calls
        for e in self._engines.values():
            e.abort(reason)

    def async_error(self):
        """The first failed engine's error (the exception its next call would raise), else None:
        a query, no call (StreamEngine::async_error: one atomic load per healthy engine)."""
        self._adopt_all()
        for e in list(self._engines.values()):
            err = e.async_error()
            if err is not None:
                return err
        return None


class CommunicatorFailure:
    """Communicator's part: its host core (``self._core``) and its device route, if it has one."""

    def abort(self, reason: str = "aborted by the user"):
        """Abort: fail queued and future calls at once, and tell the peers."""
        if self._device_route is not None:
            self._device_route.abort(reason)
        self._core.abort(reason)

    @property
    def aborted(self) -> bool:
        return self._core.aborted()

    def async_error(self):
        """The error the communicator's device calls failed with, asked without making a call (as
        NCCL's ``ncclCommGetAsyncError``): the exception the next device call would raise
        (``PeerError`` naming the dead rank and the collective, ``MismatchError``, ``CommError``),
        or ``None`` while every stream engine is healthy. Cheap (an atomic load per engine) and
        changes nothing. What it is for: a graph's replays have no work handle, so a peer's death
        during one is otherwise seen only at the next call (docs/gpu.md, "CUDA graphs")."""
        if self._device_route is None:
            return None
        return self._device_route.async_error()
