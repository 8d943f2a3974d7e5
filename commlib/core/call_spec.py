"""The call spec the extension takes: collective, dtype and op as its enums (``_C.Collective``,
``_C.DType``, ``_C.RedOp``, csrc/common/types.h), converted from the API's names once, here at the
Python API's edge, so that no binding parses a name back (tests/python/test_call_spec.py scans
csrc/bindings for it).

The host call path converts after its argument checks (commlib/core/call_checks.py) accepted the
names, through the tables; every other entry point (commlib.schedule/verify/sim/bench, the CLIs)
converts with :func:`collective`, :func:`dtype` and :func:`op`, which raise ``ValueError`` naming
the argument before anything runs."""
from __future__ import annotations

import commlib._C as _C

COLLECTIVE = dict(_C.Collective.__members__)
DTYPE = dict(_C.DType.__members__)
OP = dict(_C.RedOp.__members__)


def _convert(table: dict, enum, value, arg: str):
    try:
        return table[value]  # a name, the usual case: one look-up
    except (KeyError, TypeError):  # TypeError: an unhashable value
        if isinstance(value, enum):
            return value
        # The wording C++ used when it parsed names (csrc/common/types.cc parse_enum).
        raise ValueError(f"{arg}: unknown value '{value}' (expected one of: {' '.join(table)})") from None


def collective(name, arg: str = "collective") -> "_C.Collective":
    """``_C.Collective`` for a collective's name (an enum passes through); ValueError naming ``arg``."""
    return _convert(COLLECTIVE, _C.Collective, name, arg)


def dtype(name, arg: str = "dtype") -> "_C.DType":
    """``_C.DType`` for a dtype's name (an enum passes through); ValueError naming ``arg``."""
    return _convert(DTYPE, _C.DType, name, arg)


def op(name, arg: str = "op") -> "_C.RedOp":
    """``_C.RedOp`` for a reduction's name (an enum passes through); ValueError naming ``arg``."""
    return _convert(OP, _C.RedOp, name, arg)
