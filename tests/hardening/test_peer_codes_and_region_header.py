"""Row 5: out-of-range codes from a peer, and rank 0's region header.

Before: `describe_call` indexed name tables with peer-supplied codes, so a chunk header or published
call with collective/dtype/op codes out of range printed bytes of code memory, raised
`basic_string: construction from null` or crashed with SIGSEGV; and rank 0's header (slot count and
size) was believed by every rank. Now codes are range-checked before any table lookup and the
header is compared with what each rank computed itself.
"""
import mmap
import os
import struct

import numpy as np
import pytest

import commlib
import commlib._C as _C
from commlib.init import _make_region
from hardening_util import CTL_CALL, CTL_CALL_VERSION, Region

_DESC = struct.Struct("<QBBBBiq")  # CallDesc: seq, coll, dtype, op, algo, root, count
_CHUNK = struct.Struct("<QBBBBiqQQI")  # CallDesc + offset, bytes, flags


def bad_chunk(comm, fields):
    """Rank 1 publishes a chunk with ``fields`` to rank 0, then both all_reduce on a fresh communicator."""
    sub = comm.split(0)
    try:
        if sub.rank == 1:
            Region(sub._prefix, 2).publish_chunk(1, 0, _CHUNK.pack(*fields))
        comm.barrier()
        x = np.ones(16, np.float32)
        try:
            sub.all_reduce(x, algorithm="ring")
        except commlib.CommError as e:
            return type(e).__name__, str(e)
        return "completed", x.tolist()
    finally:
        sub.close()


@pytest.mark.parametrize("fields", [
    (1, 200, 0, 0, 1, 0, 16, 0, 32, 0),      # collective code out of range
    (1, 0, 99, 77, 250, 0, 16, 0, 32, 0),    # dtype, op and algorithm codes out of range
    (1, 9, 250, 0, 0, 0, 16, 0, 32, 0),      # send with a bad dtype
    (1, 0, 0, 0, 1, 0, 16, 0, 32, 1 << 7),   # unknown flag bits
    (1, 0, 0, 0, 1, 0, 16, 0, 32, 1),        # a forged rendezvous (single-copy read of a bogus address)
], ids=["coll", "dtype-op-algo", "send-dtype", "flags", "rendezvous"])
def test_bad_codes_in_a_chunk_header_give_a_clean_error(pool, fields):
    results = pool(2).run(bad_chunk, fields, timeout=30)
    kind, msg = results[0]
    if fields[-1] == 1 and kind == "PeerError":
        # Single-copy reads on (COMMLIB_CMA=auto, docs/transports.md): the forged rendezvous is
        # honoured as a read of rank 1's memory at a bogus address, which fails cleanly, naming it.
        assert "rank 1" in msg and "could not be read" in msg, msg
        return
    assert kind in ("MismatchError", "CommError"), results
    assert "code 200" in msg or "code 99" in msg or "code 250" in msg or "invalid flags" in msg, msg
    assert results[1][0] in ("MismatchError", "CommError", "PeerError"), results


def bad_published_call(comm):
    """Rank 1 claims to be in a call with out-of-range codes; rank 0 describes it in its error."""
    sub = comm.split(0)
    try:
        if sub.rank == 1:
            region = Region(sub._prefix, 2)
            region.write(region.ctl(1) + CTL_CALL, _DESC.pack(1, 250, 251, 252, 253, 0, 16))
            region.write(region.ctl(1) + CTL_CALL_VERSION, struct.pack("<Q", 2))
        comm.barrier()
        if sub.rank == 1:
            return None
        try:
            sub.all_reduce(np.ones(16, np.float32))
        except commlib.MismatchError as e:
            return str(e)
        return "completed"
    finally:
        comm.barrier()
        sub.close()


def test_bad_codes_in_a_peers_published_call(pool):
    msg = pool(2).run(bad_published_call, timeout=30)[0]
    assert "rank 1 called collective code 250" in msg, msg


_FIELDS = {"magic": (0, "<Q"), "size": (8, "<I"), "nslots": (12, "<I"), "slot_bytes": (16, "<Q")}


def _region(**header):
    """A 2-rank region laid out by rank 0's core, then header fields overridden by ``header``."""
    fd = _make_region(2, "t")
    _C.Communicator(0, 2, fd, 5.0, "t", 0).close()
    with mmap.mmap(fd, 4096) as m:
        for name, value in header.items():
            off, fmt = _FIELDS[name]
            m[off:off + struct.calcsize(fmt)] = struct.pack(fmt, value)
    return fd


@pytest.mark.parametrize("header,expect", [
    ({"magic": 0}, "bad magic"),
    ({"size": 7}, "world size 2 differs from rank 0's 7"),
    ({"nslots": 64}, "region header says 64 slots"),
    ({"slot_bytes": 1 << 30}, "region header says 4 slots of 1073741824"),
], ids=["magic", "size", "nslots", "slot_bytes"])
def test_region_header_is_checked_against_this_ranks_layout(header, expect):
    fd = _region(**header)
    try:
        with pytest.raises(commlib.CommError, match=expect):
            _C.Communicator(1, 2, fd, 5.0, "t", 0)
    finally:
        os.close(fd)


def test_region_descriptor_checks():
    """Unsealed, mis-sized, or not commlib's memfd: each is refused before it is mapped."""
    unsealed = os.memfd_create("commlib:t")
    os.ftruncate(unsealed, _C.shm_region_bytes(2))
    wrong_size = os.memfd_create("commlib:t", os.MFD_ALLOW_SEALING)
    os.ftruncate(wrong_size, 4096)
    import fcntl
    fcntl.fcntl(wrong_size, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    foreign = os.memfd_create("other", os.MFD_ALLOW_SEALING)
    os.ftruncate(foreign, _C.shm_region_bytes(2))
    fcntl.fcntl(foreign, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    try:
        for fd, expect in ((unsealed, "not a memfd sealed"), (wrong_size, "has 4096 bytes but this rank computed"),
                           (foreign, "not a commlib memfd")):
            with pytest.raises(commlib.CommError, match=expect):
                _C.Communicator(1, 2, fd, 5.0, "t", 0)
    finally:
        for fd in (unsealed, wrong_size, foreign):
            os.close(fd)
