"""Every ``COMMLIB_*`` environment variable, read through the core's settings table.

The table lives in C++ (``csrc/common/params.cc``: name, type, default, meaning), so the core and
this layer read the same variables with the same defaults; README's "Settings" table mirrors it.
``get`` raises for a name the table does not declare, so a typo cannot silently read nothing.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, List

import commlib._C as _C

# The choices of the enumerated device settings, as the core parses them (csrc/stream/kernel_path.cc,
# csrc/stream/device_link.cc), for get_choice.
DEVICE_PATHS = ("auto", "kernel", "copy")
DEVICE_LINKS = ("auto", "ipc", "nccl")


def table() -> List[Dict[str, Any]]:
    """[{name, type, default, meaning, range}] for every declared variable, in README order;
    ``range`` is ``(lo, hi)`` for int and bytes settings, else ``None``."""
    return list(_C.settings())


def get(name: str) -> str:
    """The variable's value, or its declared default when unset or empty."""
    return _C.setting(name)


def is_set(name: str) -> bool:
    """Whether the environment sets the variable to a non-empty value (a default does not count): for
    settings whose unset state means something of its own, as COMMLIB_STREAM_BYTES's (the tuning's
    entries decide)."""
    return _C.setting_is_set(name)


def get_int(name: str) -> int:
    """An int or bytes variable as an integer in its declared range; ValueError naming it otherwise."""
    return _C.setting_int(name)


def get_choice(name: str, allowed) -> str:
    """An enumerated ("name") variable as the one of ``allowed`` it names, blanks and case ignored
    (its default when unset; "" when it has none); ValueError naming the variable, its value and the
    choices otherwise: the core's message (param_choice), so Python and C++ refuse alike."""
    return _C.setting_choice(name, list(allowed))


def get_seconds(name: str) -> float:
    """A positive number of seconds; ValueError naming the variable otherwise."""
    v = get(name)
    try:
        t = float(v)
    except ValueError:
        raise ValueError(f"{name}: expected seconds, got {v!r}") from None
    if not t > 0:
        raise ValueError(f"{name}: must be positive, got {v!r}")
    return t


@contextlib.contextmanager
def overridden(updates: Dict[str, str]):
    """The process environment with ``updates`` inside the ``with`` block, restored after. For
    settings read once when something is created (an engine, an emulated device): the only way to
    give one such object other settings than the rest of the process."""
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
