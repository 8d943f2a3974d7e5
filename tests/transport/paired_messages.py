"""A 2-rank all_reduce whose middle step holds two messages each way between the pair (ir.h: they
match in op order), run over the toy transport's stuttering links (transport/toy/toy.h) by
tests/transport/test_toy_transport.py: the host executor must move a pair's second message of a
step only once the first is all on the link (sent) or all taken (received).

The buffer is cut into a small segment X (the first quarter) and a large one Y; each is
reduce-scattered then all-gathered, pipelined: step 1 reduce-scatters Y, step 2 all-gathers Y and
reduce-scatters X (a send and a receive of each with the peer, Y's first), step 3 all-gathers X.
Y's messages take several chunks; with every other peek of a link empty (acquire full), X's
receive (send) asks the link while Y's is part way, and taking (publishing) a chunk then would put
X's data where Y's belongs or the reverse. (tests/sim/test_schedule_player.py plays the same shape
in small.)
"""
import numpy as np

import commlib
from commlib import _C


def paired_all_reduce(rank, size, count, root):
    """One rank's schedule (commlib.schedule's format); 2 ranks only."""
    if size != 2:
        raise ValueError(f"size: paired_all_reduce runs on 2 ranks, got {size}")
    peer, x = 1 - rank, count // 4
    y = count - x
    halves = {"X": [(0, x // 2), (x // 2, x - x // 2)], "Y": [(x, y // 2), (x + y // 2, y - y // 2)]}

    def msg(kind, seg, who):
        return {"op": kind, "peer": peer, ("src" if kind == "send" else "dst"): ("output", *halves[seg][who])}
    return {"steps": [
        [{"op": "copy", "dst": ("output", 0, count), "src": ("input", 0, count)}],
        [msg("send", "Y", peer), msg("recv_reduce", "Y", rank)],
        [msg("send", "Y", rank), msg("send", "X", peer), msg("recv", "Y", peer), msg("recv_reduce", "X", rank)],
        [msg("send", "X", rank), msg("recv", "X", peer)]]}


def paired_over_stuttering_links(comm, count, calls):
    """Ranks 0 and 1 over the toy's stuttering links: `calls` all_reduces of `count` float32 with
    paired_all_reduce; the wrong elements of each (rank 2 and up: None)."""
    _C.toy_transport(True)
    commlib.register_algorithm("all_reduce", "paired", paired_all_reduce, summary="two messages a pair a step")
    try:
        sub = comm.split(0 if comm.rank < 2 else 1)
        try:
            if comm.rank >= 2:
                return None
            assert list(sub.topology.links) == ["self" if q == sub.rank else "toy" for q in range(2)]
            _C.toy_transport_stutter(True)
            wrong = []
            for i in range(calls):
                v = (np.arange(count, dtype=np.float32) % 1024) * (sub.rank + 1) + i
                sub.all_reduce(v, algorithm="paired")
                wrong.append(int(np.count_nonzero(v != (np.arange(count, dtype=np.float32) % 1024) * 3 + 2 * i)))
            return wrong
        finally:
            _C.toy_transport_stutter(False)
            sub.close()
    finally:
        commlib.unregister_algorithm("all_reduce", "paired")
        _C.toy_transport(False)
