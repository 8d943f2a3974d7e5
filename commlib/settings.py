"""Every ``COMMLIB_*`` environment variable, read through the core's settings table.

The table lives in C++ (``csrc/common/params.cc``: name, type, default, meaning), so the core and
this layer read the same variables with the same defaults; README's "Settings" table mirrors it.
``get`` raises for a name the table does not declare, so a typo cannot silently read nothing.
"""
from __future__ import annotations

from typing import Any, Dict, List

import commlib._C as _C


def table() -> List[Dict[str, Any]]:
    """[{name, type, default, meaning, range}] for every declared variable, in README order;
    ``range`` is ``(lo, hi)`` for int and bytes settings, else ``None``."""
    return list(_C.settings())


def get(name: str) -> str:
    """The variable's value, or its declared default when unset or empty."""
    return _C.setting(name)


def get_int(name: str) -> int:
    """An int or bytes variable as an integer in its declared range; ValueError naming it otherwise."""
    return _C.setting_int(name)


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
