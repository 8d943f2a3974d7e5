"""The inputs the simulator's validation scripts (bench/sim_validate.py, sim_tcp.py, sim_cores.py)
read: committed bench summaries and the bench CSV. One missing is a broken tree or a wrong
argument, never a section to skip: the script stops naming the file and the command that makes it.
"""
from __future__ import annotations

import os


def require(path: str, how: str) -> str:
    """``path`` when it exists; else SystemExit naming it and ``how`` (the command that makes it)."""
    if not os.path.exists(path):
        raise SystemExit(f"missing input {path}: {how}")
    return path
