"""Issue #27 item 3: a split entry that one rank refuses stops every rank at once.

Before: the rank that refused the entry raised at once, but a rank that had read a good entry
(the real value arrived after the refused one) went on into the new communicator's rendezvous,
which watched only its own error key, and waited out the whole timeout. Now that rendezvous also
watches the split's error key.
"""
import time

import commlib


def split_after_a_refused_entry(comm):
    """Rank 0 plants junk under rank 1's split entry and reads it before rank 1 (1 s later) writes
    the real one: rank 0 refuses it; rank 1 reads only good entries. Returns (seconds from this
    rank's split call to its error, the error)."""
    n = comm._splits + 1
    inner = getattr(comm._store, "inner", comm._store)  # under the signing wrapper, if any
    comm.barrier()
    if comm.rank == 0:
        inner.set(f"{comm._prefix}/split{n}/in/1", b"not a split entry")
    else:
        time.sleep(1.0)
    t = time.monotonic()
    try:
        comm.split(0, timeout=20)
    except commlib.RendezvousError as e:
        return time.monotonic() - t, str(e)
    return time.monotonic() - t, None


def test_every_rank_raises_within_a_second(pool):
    results = pool(2).run(split_after_a_refused_entry, timeout=60)
    for rank, (seconds, error) in enumerate(results):
        assert error is not None and "rank 1's entry" in error, (rank, error)
        assert seconds < 1.0, (rank, seconds, error)  # not the 20 s timeout
