"""Rank-side check that each pair's bytes ride the transport the table chose for it."""
import numpy as np

BYTES = 300_000  # >= 64 KiB: a TCP link sends it from the caller's buffer (sent_in_place moves)


def carriers(comm):
    """For every pair in turn (same order on every rank), its two ranks exchange one message;
    returns, by peer, the link kind this rank reports and whether the TCP transport carried the
    message it sent there."""
    P, r = comm.size, comm.rank
    kinds = list(comm.topology.links)
    out = {}
    for a in range(P):
        for b in range(a + 1, P):
            if r not in (a, b):
                continue
            peer = b if r == a else a
            before = comm._core.tcp_stats()["sent_in_place"]
            got = np.zeros(BYTES // 8, np.int64)
            comm.sendrecv(np.full(BYTES // 8, r, np.int64), peer, got, peer)
            assert (got == peer).all(), f"rank {r} got wrong data from rank {peer}"
            out[peer] = (kinds[peer], comm._core.tcp_stats()["sent_in_place"] > before)
    return out
