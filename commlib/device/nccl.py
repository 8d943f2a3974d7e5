"""NCCL, loaded at run time (no NCCL at build time): ``load()`` dlopens libnccl from
``COMMLIB_NCCL_LIBRARY`` if set, else from the nvidia-nccl-cu12 / -cu13 wheels on ``sys.path``,
else through the dynamic loader's search path, and resolves the functions the coming ``nccl``
link uses (csrc/device/nccl_loader.h). Loading happens once per process.
"""
from __future__ import annotations

import glob
import os
import sys
from typing import List, Tuple

from commlib import settings
import commlib._C as _C


def candidates() -> List[str]:
    """The libraries ``load()`` tries, in order."""
    forced = settings.get("COMMLIB_NCCL_LIBRARY")
    if forced:
        return [forced]
    found = []
    for entry in sys.path:
        for pattern in ("nvidia/nccl/lib/libnccl.so*", "nvidia/cu1*/lib/libnccl.so*"):
            found.extend(sorted(glob.glob(os.path.join(entry or ".", pattern))))
    return found + ["libnccl.so.2"]


def load() -> Tuple[Tuple[int, int, int], str]:
    """Load libnccl; return ((major, minor, patch), path). RuntimeError lists what was tried."""
    code, path = _C.load_nccl(candidates())
    # NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch (older: major * 1000 + minor * 100).
    if code >= 10000:
        return (code // 10000, code // 100 % 100, code % 100), path
    return (code // 1000, code // 100 % 10, code % 100), path
