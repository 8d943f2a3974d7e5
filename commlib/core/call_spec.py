"""The call spec the host engine takes: collective, dtype and op as the extension's enums
(``_C.Collective``, ``_C.DType``, ``_C.RedOp``, csrc/common/types.h), converted from the API's
names once, here at the Python API's edge, after the argument checks (commlib/core/call_checks.py)
accepted them, so that C++ parses no name back on the call path."""
from __future__ import annotations

import commlib._C as _C

COLLECTIVE = dict(_C.Collective.__members__)
DTYPE = dict(_C.DType.__members__)
OP = dict(_C.RedOp.__members__)
