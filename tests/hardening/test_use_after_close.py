"""Row 9: `split()` (and every other call) after `close()`.

Before: rank 0 built a new communicator and rank 1 got ConnectionResetError. Now every call after
close() raises CommError at once on every rank, split included.
"""
import numpy as np

import commlib


def calls_after_close(comm):
    sub = comm.split(0)
    sub.close()
    sub.close()  # idempotent
    outcome = {}
    for name, call in (("split", lambda: sub.split(0)),
                       ("all_reduce", lambda: sub.all_reduce(np.ones(4, np.float32))),
                       ("all_reduce-general", lambda: sub.all_reduce(np.ones(4, np.float32), out=np.ones(4, np.float32))),
                       ("barrier", lambda: sub.barrier()),
                       ("broadcast-async", lambda: sub.broadcast(np.ones(4, np.float32), async_op=True)),
                       ("send", lambda: sub.send(np.ones(2, np.float32), 1 - sub.rank))):
        try:
            call()
            outcome[name] = "ran"
        except commlib.CommError as e:
            outcome[name] = "closed" in str(e)
    return outcome


def test_every_call_after_close_raises(pool):
    for res in pool(2).run(calls_after_close, timeout=30):
        assert all(v is True for v in res.values()), res


def bool_ranks(comm):
    refused = []
    for name, call in (("root", lambda: comm.broadcast(np.ones(2, np.float32), root=True)),
                       ("peer", lambda: comm.send(np.ones(2, np.float32), True)),
                       ("color", lambda: comm.split(True))):
        try:
            call()
        except ValueError as e:
            refused.append(name in str(e))
    return refused


def test_a_bool_is_not_a_rank(pool):
    assert pool(2).run(bool_ranks, timeout=30) == [[True, True, True]] * 2
    import pytest
    with pytest.raises(ValueError, match="rank"):
        commlib.init(rank=True, world_size=2)
