"""Issue #27 item 4: ranks, roots, peers, colors and keys that are NumPy integers are accepted
(as torch and MPI accept them); floats and bools are refused as "must be an int", not as
"out of range", before anything is sent."""
import numpy as np
import pytest

import commlib
from commlib.core.call_checks import as_int, as_rank


def numpy_ranks(comm):
    me, other = comm.rank, 1 - comm.rank
    x = np.full(4, me + 1, np.int64)
    comm.broadcast(x, root=np.int64(1))
    ok = [bool((x == 2).all())]
    y = np.full(4, me + 1, np.int32)
    comm.reduce(y, root=np.int32(0))
    ok.append(bool((y == 3).all()) if me == 0 else True)
    z = np.zeros(3, np.float32)
    if me == 0:
        comm.send(np.arange(3, dtype=np.float32), np.int64(other))
    else:
        comm.recv(z, np.uint8(other))
        ok.append(bool((z == np.arange(3)).all()))
    sub = comm.split(np.int64(0), key=np.int16(-me))  # keys order the new ranks: reversed
    ok.append(sub.rank == other)
    sub.close()
    refused = []
    for name, call in (("root", lambda: comm.broadcast(x, root=1.0)),
                       ("root", lambda: comm.broadcast(x, root=np.bool_(True))),
                       ("peer", lambda: comm.send(x, np.float64(other))),
                       ("color", lambda: comm.split(0.0))):
        try:
            call()
            refused.append(False)
        except ValueError as e:
            refused.append(str(e).startswith(f"{name}: must be an int"))
    return ok + refused


def test_numpy_integer_ranks_work_and_floats_are_named(pool):
    assert pool(2).run(numpy_ranks, timeout=60) == [[True] * 7, [True] * 8]


def test_conversions():
    assert as_int(np.int64(3), "root") == 3 and type(as_int(np.uint32(3), "root")) is int
    assert as_rank(np.int8(1), "peer", 2) == 1
    for bad in (True, np.bool_(False), 1.0, np.float32(1), "1", None):
        with pytest.raises(ValueError, match="^root: must be an int"):
            as_int(bad, "root")
    with pytest.raises(ValueError, match="^root: 2 is out of range for a communicator of size 2"):
        as_rank(np.int64(2), "root", 2)


def test_init_takes_numpy_rank_and_size():
    comm = commlib.init(rank=np.int64(0), world_size=np.int32(1), master_addr="127.0.0.1", master_port=0)
    try:
        assert comm.rank == 0 and type(comm.rank) is int and comm.size == 1
    finally:
        comm.close()
    with pytest.raises(ValueError, match="^world_size: must be an int"):
        commlib.init(rank=0, world_size=2.0)
