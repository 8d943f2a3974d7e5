"""commlib: collective communication for deep learning.

    import commlib, numpy as np
    comm = commlib.init()                    # RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or arguments
    x = np.full(1000, comm.rank, np.float32)
    comm.all_reduce(x, op="sum", algorithm="ring")

Schedules can be inspected and verified without any process: ``commlib.schedule(...)``,
``commlib.algorithms(...)``, ``commlib.verify(...)``.
"""
import sys as _sys

import commlib._C as _C
from commlib.bootstrap import secret, store
from commlib.core import communicator, schedules, tuning, work
from commlib.core.communicator import Communicator, Work
from commlib.device import emulated, nccl
from commlib.errors import CommError, MismatchError, PeerError, RendezvousError, StoreLostError
from commlib.init import init
from commlib.core.schedules import (VerificationError, algorithm_info, algorithms, format_schedule,
                                    register_algorithm, schedule, unregister_algorithm, verify)

# The modules documented as commlib.<name> before the package was grouped into layers (bootstrap/,
# core/, device/) stay importable under those names: `import commlib.store`,
# `from commlib.emulated import ...` find the moved module (tests/python/test_public_names.py).
PUBLIC_MODULES = {"store": store, "secret": secret, "communicator": communicator, "schedules": schedules,
                  "tuning": tuning, "work": work, "emulated": emulated, "nccl": nccl}
for _name, _module in PUBLIC_MODULES.items():
    _sys.modules.setdefault(f"{__name__}.{_name}", _module)

__version__ = "0.1.0"

__all__ = [
    "init", "Communicator", "Work", "CommError", "MismatchError", "PeerError", "RendezvousError", "StoreLostError",
    "schedule", "algorithms", "algorithm_info", "register_algorithm", "unregister_algorithm", "verify", "format_schedule",
    "VerificationError",
    "DTYPES", "OPS", "COLLECTIVES",
]

DTYPES = tuple(_C.DTYPES)
OPS = tuple(_C.OPS)
COLLECTIVES = tuple(c for c in _C.COLLECTIVES if c not in ("send", "recv"))


def _load_tuning():
    # A broken tuning file must not break `import commlib`, but it is never ignored silently:
    # the warning names the file and what is wrong with it (auto then uses its built-in rules).
    try:
        tuning.load_default()
    except (OSError, ValueError) as exc:
        import warnings
        warnings.warn(f"commlib: tuning file not used: {exc}", RuntimeWarning, stacklevel=2)


_load_tuning()
