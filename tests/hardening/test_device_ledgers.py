"""The /dev/shm ledgers every process using a device shares (csrc/device/shared_ledger.h: the
kernel path's device-wide grid budget, the emulated device's resident blocks) against what a
crashed or hostile process of the same user leaves there: a ledger full of garbage (entries of
processes that do not run, counts past the table) is reclaimed by the next claim, which gets the
whole device, and the ledger is gone once that claim is released; a ledger at the path that is
too short is grown, not read past its end; a path that cannot be a ledger (a directory there) is
an error naming it, not a claim made without one. Nothing is left in /dev/shm."""
import os
import uuid

import numpy as np
import pytest

import commlib._C as _C


def _device():
    return f"emulated:hostile{uuid.uuid4().hex[:12]}:0"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [0, 100, 64 * 1024, 1 << 20])
def test_a_garbage_ledger_is_reclaimed_and_removed(size):
    device = _device()
    name = _C.grid_claims(device)["ledger"]
    path = "/dev/shm/" + name
    rng = np.random.default_rng(size)
    with open(path, "wb") as f:  # what a crashed writer or a hostile process of this user could leave
        f.write(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    try:
        claims = _C.GridClaims()
        assert claims.claim(device, 10, 12345, 10, [os.getpid()]) == 10  # every garbage entry is nobody's
        assert [e[:3] for e in _C.grid_claims(device)["entries"]] == [(12345, 10, 1)]
        claims.release()
        assert not _C.shared_ledger_exists(name)
    finally:
        if os.path.exists(path):
            os.unlink(path)
            pytest.fail(f"{path} was left behind")


@pytest.mark.timeout(60)
def test_a_path_that_cannot_be_a_ledger_is_an_error_naming_it():
    device = _device()
    path = "/dev/shm/" + _C.grid_claims(device)["ledger"]
    os.mkdir(path)
    try:
        with pytest.raises(RuntimeError, match="cannot open " + path):
            _C.GridClaims().claim(device, 10, 1, 1, [os.getpid()])
    finally:
        os.rmdir(path)
