"""A clean interpreter exit for processes that use the torch backend.

Two ways a job that ended well died with SIGABRT at exit ("terminate called without an active
exception"), both threads that take the GIL after CPython started finalizing, which makes CPython
end them with pthread_exit, whose forced unwind through a C++ noexcept frame calls std::terminate:

* our own: a group's completion thread (or any thread) blocked in a commlib call returns during
  finalization. The bindings now park such a thread instead (csrc/bindings/gil.h), and at exit
  every group still open is closed (aborted if calls are in flight), joining its thread;
* torch's: a gloo worker thread drops the last reference to a finished work's tensors a moment
  after the caller's ``wait()`` returned; releasing a tensor that has a Python object takes the
  GIL. If the main thread reached finalization in that moment (a gloo call just before exit, and
  a busy machine) the worker is ended inside the work's destructor. Nothing in torch's API says
  when its threads are done, so at exit this module yields the GIL until every other thread of
  the process has been asleep for a few consecutive polls (at most ``_QUIESCE_LIMIT_S``).

The handler is registered when ``commlib.torch`` is imported, after torch.distributed's import,
so it runs before torch's own exit handlers and after those the user registers later.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import weakref
from typing import Optional

_groups: "weakref.WeakSet" = weakref.WeakSet()
_QUIESCE_LIMIT_S = 2.0
_QUIET_POLLS = 3


def track(group) -> None:
    """Close ``group`` at interpreter exit if it is still open then."""
    _groups.add(group)


def _thread_states():
    """State letter (R, S, D, ...) of every other thread of this process (Linux /proc)."""
    me = threading.get_native_id()
    states = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return states
    for tid in tids:
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        states[tid] = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return states


def wait_for_quiet_threads(limit_s: Optional[float] = None) -> bool:
    """Yield the GIL until no other thread has been runnable for ``_QUIET_POLLS`` polls in a row.

    True when that happened within ``limit_s``. A thread waiting for the GIL sleeps, but each poll
    sleeps with the GIL released first, so such a thread gets its turn before the next look.
    """
    deadline = time.monotonic() + (_QUIESCE_LIMIT_S if limit_s is None else limit_s)
    quiet = 0
    while time.monotonic() < deadline:
        time.sleep(0.001)
        busy = any(s in (b"R", b"D") for s in _thread_states().values())
        quiet = 0 if busy else quiet + 1
        if quiet >= _QUIET_POLLS:
            return True
    return False


_unreported = []  # errors report_unreported logged: the exit status says so


def report_unreported(rank, error) -> None:
    """Logs a device call's error that no call, ``wait()`` or ``synchronize()`` raised (found when
    its group shut down), as torch's NCCL watchdog logs a failed collective; a process that exits
    with one logged exits with status 1 (torch's watchdog tears the process down instead)."""
    _unreported.append(error)
    logging.getLogger("commlib.torch").error(
        "rank %s: a collective on device tensors failed and no call reported it: %s: %s",
        rank, type(error).__name__, error)


def _at_exit():
    for group in list(_groups):
        try:
            group._stop_at_exit()
        except Exception:  # noqa: BLE001 - exit must go on (an unreported error was logged)
            pass
    wait_for_quiet_threads()
    if _unreported:  # the job must not exit 0 after a collective silently failed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


atexit.register(_at_exit)
