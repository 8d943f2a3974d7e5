"""Row 11: a same-user process truncating the memfd.

Before: every rank died of SIGBUS (the memfd was not sealed). Now rank 0 seals it against shrinking
and growing right after sizing it, every rank checks the seals before mapping, and a truncation
attempt fails with EPERM while the communicator goes on working.
"""
import os

import numpy as np
import pytest

from commlib.init import _make_region


def test_region_cannot_be_truncated_or_grown():
    fd = _make_region(2, "seal")
    try:
        size = os.fstat(fd).st_size
        for new in (0, size // 2, size + 4096):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, new)
        assert os.fstat(fd).st_size == size
    finally:
        os.close(fd)


def truncate_live_region(comm):
    """Rank 1 reopens the live region through /proc/<rank 0's pid>/map_files and tries to truncate it."""
    sub = comm.split(0)
    try:
        outcome = None
        if sub.rank == 1:
            name = f"/memfd:commlib:{sub._prefix} (deleted)"
            with open("/proc/self/maps") as f:
                span = [line.split()[0] for line in f if line.rstrip().endswith(name)][-1]
            try:
                fd = os.open(f"/proc/self/map_files/{span}", os.O_RDWR)
            except OSError as e:
                outcome = f"skip: {e}"
            else:
                try:
                    os.ftruncate(fd, 0)
                    outcome = "truncated"
                except PermissionError:
                    outcome = "refused"
                finally:
                    os.close(fd)
        comm.barrier()
        x = np.full(1 << 16, sub.rank + 1, np.float32)
        sub.all_reduce(x)
        return outcome, bool((x == 3).all())
    finally:
        sub.close()


def test_live_region_survives_a_truncation_attempt(pool):
    (_, ok0), (outcome, ok1) = pool(2).run(truncate_live_region, timeout=30)
    if outcome.startswith("skip"):
        pytest.skip(f"/proc/self/map_files not openable here ({outcome})")
    assert outcome == "refused" and ok0 and ok1
