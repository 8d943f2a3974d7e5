"""torch Work objects over commlib calls, and the thread that completes asynchronous ones.

A torch call becomes a ``Call``: the commlib works it queued, finalizers (copies back out of
staging buffers) and the value of its future. Blocking calls finish on the caller's thread. An
asynchronous call is handed to the group's ``Completer``, one thread that waits on the works in call
order, runs the finalizers and completes the ``torch.futures.Future`` behind the returned ``Work``.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Optional

import torch
import torch.distributed as dist
from torch.futures import Future

from commlib.core.call_checks import seconds_value


def timeout_seconds(timeout) -> Optional[float]:
    """Seconds from a timedelta or a number; None for no timeout (None, zero or negative)."""
    if timeout is None:
        return None
    s = seconds_value(timeout)  # a timedelta or a number; text is refused, not converted
    return s if s > 0 else None


class Call:
    """The pieces of one torch call: commlib works to wait on, finalizers, the future's value."""

    __slots__ = ("works", "finals", "result")

    def __init__(self, result):
        self.works = []
        self.finals = []
        self.result = result

    def finish(self):
        """Run the finalizers (on this thread)."""
        if self.finals:
            with torch.no_grad():
                for f in self.finals:
                    f()
            self.finals = []


class Completer:
    """One thread per group that completes asynchronous calls in call order (started on first use)."""

    def __init__(self, name: str):
        self._name = name
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._pending = 0

    def on_thread(self) -> bool:
        """True when called from the completion thread itself (e.g. in a future's callback)."""
        return self._thread is not None and threading.current_thread() is self._thread

    def idle(self) -> bool:
        return self._pending == 0

    def put(self, call: Call, futs):
        """Complete ``futs`` ((future, value) pairs) once ``call``'s works are done."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, daemon=True,
                                                    name=f"commlib-torch-{self._name}")
                    self._thread.start()
        with self._lock:
            self._pending += 1
        self._queue.put((call, futs))

    def _loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            call, futs = item
            try:
                for w in call.works:
                    w.wait()
                call.finish()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                for fut, _ in futs:
                    fut.set_exception(exc)
            else:
                for fut, result in futs:
                    fut.set_result(result)
            with self._lock:
                self._pending -= 1

    def stop(self, timeout: Optional[float] = None):
        """Let the thread finish what is queued, then end it (joined unless called from it)."""
        if self._thread is None:
            return
        self._queue.put(None)
        if not self.on_thread():
            self._thread.join(timeout)


def completed_work(result) -> "Work":
    fut = Future()
    fut.set_result(result)
    return Work(fut)


def _value_or_raise(fut):
    return fut.value()  # a future failed by ``set_exception`` raises its error here


def erroring_future(fut: Future) -> Future:
    """A future that completes with ``fut``'s value, or fails with a C++-level error.

    ``Future.set_exception`` from Python does not fail the C++ future: it completes it with the
    exception object as its *value* and only Python's ``wait()`` raises. C++ readers (DDP's
    reducer parses the bucket future's value as tensors) then read an exception as a tensor list
    and crash (SIGSEGV in ``loss.backward()`` when a peer died). A callback that raises does fail
    the C++ future (``then`` catches it and sets the error), so every reader, C++ or Python, gets
    ``RuntimeError: ... PeerError: ... rank N ...``.
    """
    return fut.then(_value_or_raise)


class Work(dist.Work):
    """torch Work over a ``torch.futures.Future`` whose value is the list of output tensors.

    Unlike ``_create_work_from_future`` (whose ``wait()`` swallows the future's error), ``wait()``
    raises the commlib error (MismatchError, PeerError, ...) that failed the call;
    ``get_future()`` gives a future whose error C++ readers see as well (``erroring_future``).
    """

    def __init__(self, fut):
        super().__init__()
        self._fut = fut
        self._public_fut = None

    def wait(self, timeout=None):
        secs = timeout_seconds(timeout)
        if secs is not None and not self._fut.done():
            deadline = time.monotonic() + secs
            delay = 1e-5
            while not self._fut.done():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"commlib backend: work not completed within {secs:g} s")
                time.sleep(delay)
                delay = min(delay * 2, 1e-3)
        self._fut.wait()  # raises the call's error
        return True

    def get_future(self):
        if self._public_fut is None:
            self._public_fut = erroring_future(self._fut)
        return self._public_fut

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        if not self._fut.done():
            return False
        try:
            self._fut.wait()
        except Exception:  # noqa: BLE001
            return False
        return True

    def exception(self):
        if not self._fut.done():
            return None
        try:
            self._fut.wait()
        except Exception as exc:  # noqa: BLE001
            return exc
        return None

    def result(self):
        return self._fut.wait()

    def synchronize(self):
        pass


class P2PWork(Work):
    """Work of a send/recv: waiting (or polling) on it first issues the held-back batch."""

    def __init__(self, pg, fut):
        super().__init__(fut)
        self._pg = pg

    def wait(self, timeout=None):
        self._pg._flush_p2p()
        return super().wait(timeout)

    def get_future(self):
        self._pg._flush_p2p()
        return super().get_future()

    def is_completed(self):
        self._pg._flush_p2p()
        return self._fut.done()


class AnySourceWork(Work):
    """Work of a receive from any source: ``_source_rank()`` (read by ``dist.recv``) is the sender."""

    def __init__(self, fut, source: torch.Tensor):
        super().__init__(fut)
        self._source = source

    def _source_rank(self):
        self.wait()
        return int(self._source[0])
