"""Rank side of test_collectives.py's point-to-point batch of several messages to one peer."""
from __future__ import annotations

import numpy as np


def several_messages_to_one_peer(comm):
    """One batch with six sends to the next rank and six receives from the previous one, receives
    listed first: the executor moves a pair's messages in call order (ExecOp::after), so the k-th
    send lands in the peer's k-th receive. Sizes span the copied path and the in-place one (64 KiB
    and up, several of them back to back) with an empty message between them."""
    P, r = comm.size, comm.rank
    sizes, nxt, prv = (7, 0, 1 << 15, 1 << 17, 5, 1 << 16), (r + 1) % P, (r - 1) % P
    sends = [np.arange(n, dtype=np.int32) * 10 + 1000 * r + k for k, n in enumerate(sizes)]
    recvs = [np.full(n, -1, np.int32) for n in sizes]
    comm.batch_p2p([("recv", b, prv) for b in recvs] + [("send", s, nxt) for s in sends])
    failures = []
    for k, n in enumerate(sizes):
        if not np.array_equal(recvs[k], np.arange(n, dtype=np.int32) * 10 + 1000 * prv + k):
            failures.append(f"message {k} ({n} int32) on rank {r}: got {recvs[k][:3]}")
    return failures


def several_messages_over_stuttering_links(comm, rounds=8):
    """several_messages_to_one_peer, `rounds` times, over the toy transport's stuttering links
    (transport/toy/toy.h: every other send slot and every other received chunk not there yet),
    where a receive (send) that asked the link while the pair's earlier message is part way would
    take (publish) a chunk of the wrong message: the executor's per-peer order (ExecOp::after) is
    what keeps them apart. Whether a round meets that moment is timing's (without the order about
    one round in two fails, a MismatchError naming the messages), hence the rounds."""
    from commlib import _C

    _C.toy_transport(True)
    try:
        sub = comm.split(0)
        try:
            assert list(sub.topology.links) == ["self" if q == sub.rank else "toy" for q in range(sub.size)]
            _C.toy_transport_stutter(True)
            return [f for _ in range(rounds) for f in several_messages_to_one_peer(sub)]
        finally:
            _C.toy_transport_stutter(False)
            sub.close()
    finally:
        _C.toy_transport(False)
