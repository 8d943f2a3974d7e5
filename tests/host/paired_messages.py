"""A 2-rank all_reduce whose middle step holds two messages each way between the pair (ir.h: they
match in op order), for the host executor's test (tests/host/test_collectives.py) and the
simulator's (tests/sim/test_schedule_player.py builds the same shape in small).

The buffer is cut into a small segment X (the first quarter) and a large one Y; each is
reduce-scattered then all-gathered, pipelined: step 1 reduce-scatters Y, step 2 all-gathers Y and
reduce-scatters X (a send and a receive of each with the peer), step 3 all-gathers X. Y's messages
take many chunks, so a receive that took the next chunk on the link instead of waiting for the
earlier message to finish would get Y's chunks where X's belong.
"""
import numpy as np

import commlib


def paired_all_reduce(rank, size, count, root):
    """One rank's schedule (commlib.schedule's format); 2 ranks only."""
    if size != 2:
        raise ValueError(f"size: paired_all_reduce runs on 2 ranks, got {size}")
    peer = 1 - rank
    x = count // 4
    halves = {"X": [(0, x // 2), (x // 2, x - x // 2)],
              "Y": [(x, (count - x) // 2), (x + (count - x) // 2, count - x - (count - x) // 2)]}

    def out(seg, who):
        off, n = halves[seg][who]
        return ("output", off, n)

    def send(seg, who):
        return {"op": "send", "peer": peer, "src": out(seg, who)}

    def recv(seg, who, kind="recv"):
        return {"op": kind, "peer": peer, "dst": out(seg, who)}
    return {"steps": [
        [{"op": "copy", "dst": ("output", 0, count), "src": ("input", 0, count)}],
        [send("Y", peer), recv("Y", rank, "recv_reduce")],
        [send("Y", rank), send("X", peer), recv("Y", peer), recv("X", rank, "recv_reduce")],
        [send("X", rank), recv("X", peer)]]}


def run_paired(comm, count, calls):
    """`calls` all_reduces of `count` float32 with paired_all_reduce; the wrong elements of each."""
    commlib.register_algorithm("all_reduce", "paired", paired_all_reduce, summary="two messages a pair a step")
    try:
        wrong = []
        for i in range(calls):
            x = (np.arange(count, dtype=np.float32) % 1024) * (comm.rank + 1) + i
            want = (np.arange(count, dtype=np.float32) % 1024) * 3 + 2 * i
            comm.all_reduce(x, algorithm="paired")
            wrong.append(int(np.count_nonzero(x != want)))
        return wrong
    finally:
        commlib.unregister_algorithm("all_reduce", "paired")
