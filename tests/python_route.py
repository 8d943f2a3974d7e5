"""Choosing which route runs a communicator's calls, for the tests that compare them (rank side).

A steady call of a ``Communicator`` crosses into C++ once, through the module's entry
(csrc/bindings/fast_call.cc, reached through ``commlib.core.communicator._fast``); a call the entry
declines (returns ``NotImplemented``) runs on the Python route. ``python_route_only`` makes the
entry decline everything inside a block, so the same calls can be made on the Python route alone:
the reference a test compares the entry's results, errors and counts with.
"""
from __future__ import annotations

import contextlib

from commlib.core import communicator


@contextlib.contextmanager
def python_route_only():
    """Inside the block the C++ entry declines every call: the Python route runs them (this process)."""
    real = communicator._fast
    communicator._fast = lambda *args: NotImplemented
    try:
        yield
    finally:
        communicator._fast = real
