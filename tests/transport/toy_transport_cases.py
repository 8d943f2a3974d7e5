"""Rank-side cases of the toy kind of transport (csrc/transport/toy): registered at run time from
the test, it carries a sub-communicator's pairs with the table, the Fabric and the executor as
they are."""
import numpy as np

from commlib import _C

BYTES = 1 << 20  # many chunks: larger than one shared-memory slot and channel


def collectives_over_the_toy(comm):
    """Registers the toy ahead of shm, splits (a new Fabric asks the table), runs a collective, a
    broadcast and a sendrecv over it; then withdraws it and splits again. Returns what the rank saw."""
    P, r = comm.size, comm.rank
    _C.toy_transport(True)
    try:
        sub = comm.split(0)
        try:
            kinds = list(sub.topology.links)
            before = _C.toy_transport_chunks()
            x = np.arange(BYTES // 8, dtype=np.float64) + r
            sub.all_reduce(x)
            assert np.array_equal(x, P * np.arange(BYTES // 8) + P * (P - 1) / 2), f"rank {r}: all_reduce"
            b = np.full(1000, r, np.int32)
            sub.broadcast(b, root=P - 1)
            assert (b == P - 1).all(), f"rank {r}: broadcast"
            to, frm = (r + 1) % P, (r - 1) % P
            got = np.zeros(BYTES // 8, np.int64)
            sub.sendrecv(np.full(BYTES // 8, r, np.int64), to, got, frm)
            assert (got == frm).all(), f"rank {r}: sendrecv"
            chunks = _C.toy_transport_chunks() - before
        finally:
            sub.close()
    finally:
        _C.toy_transport(False)
    after = comm.split(0)
    try:
        kinds_after = list(after.topology.links)
    finally:
        after.close()
    return kinds, chunks, kinds_after, _C.transport_table()
