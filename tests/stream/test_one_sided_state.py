"""The one-sided calls' state kept across calls and their trust in peers (session 32's audit of
session 31's changes: docs/gpu.md "The one-sided calls' steady state"), on the emulated device:

- the agreement's views and route and the mapped table's key, kept by the engine so that a steady
  mapped call allocates nothing, never describe an earlier call's buffers: every change of buffer
  (address, size, dtype, in place / out of place, one rank's alone, after a refused call) sums the
  call's own inputs, mapped, and writes into no other buffer;
- a peer's ring entry is checked before it is used: an offset or slot that cannot lie in the
  peer's registered allocation is refused with an error naming the peer, never mapped (a launch
  through it would read and write outside the peer's buffer);
- a peer SIGKILLed while the others wait in the agreement, or one that closed its communicator
  instead of making the call: every survivor raises a PeerError naming it and the collective, well
  within the timeout.

Rank side in one_sided_state_cases.py."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import one_sided_state_cases as cases  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402

from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank  # noqa: E402
from commlib.testing.ranks import RankPool  # noqa: E402


@pytest.mark.timeout(60)
def test_a_kept_route_never_describes_an_earlier_calls_buffers(pool):
    for rank, (steps, refused) in enumerate(pool(3, env=DELAY_ENV).run(cases.changing_buffers, timeout=50)):
        assert refused != "no error", (rank, refused)
        for what, right, kept, algo, staged in steps:
            assert right, (rank, what)
            assert kept, (rank, what, "a buffer the call does not name changed")
            assert algo == cases.ALGO and staged == 0, (rank, what, algo, staged)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("field,value", [("offset", 1 << 40), ("offset", 4096 * 4 - 64), ("slot", 1 << 20),
                                         ("call", 256), ("segment", 4096)])
def test_an_impossible_peer_entry_is_refused_naming_the_peer(field, value):
    """Rank 1 writes an entry of the next call whose offset lies past its buffer's allocation (far,
    or inside it but with the call's bytes running past its end), whose slot is past the table,
    which holds a later call's number, or which lies past the allocation inside a segment that
    claims more bytes than the memory behind its handle (the mapping's real size bounds it:
    Device::imported_bytes): ranks 0 and 2 refuse it with an error naming rank 1 and the
    collective, promptly, and launch nothing through it."""
    p = RankPool(3, timeout=50, env=dict(DELAY_ENV, COMMLIB_TIMEOUT="30"))
    try:
        results = p.run(cases.forged_entry, 1, field, value, allow_death=True, timeout=45)
    finally:
        p.kill()
    assert results[1] is None
    for rank in (0, 2):
        msg, took = results[rank]
        assert "rank 1" in msg and "all_reduce" in msg, (rank, msg)
        assert took < 10, (rank, took, msg)


@pytest.mark.timeout(90)
def test_a_peer_killed_during_the_agreement_is_named_by_every_survivor():
    results = run_killing_one_rank(3, 2, cases.killed_in_agreement, env=dict(DELAY_ENV, COMMLIB_TIMEOUT="60"),
                                   timeout=80)
    assert_survivors_named_the_dead_rank(results, 2, call="all_reduce #", within_s=30)


@pytest.mark.timeout(90)
def test_a_peer_that_closed_instead_of_calling_is_named_by_every_survivor():
    # COMMLIB_TIMEOUT 60 and the split's 30 s against 10 s: a wait for either timeout fails it
    p = RankPool(3, timeout=80, env=dict(DELAY_ENV, COMMLIB_TIMEOUT="60"))
    try:
        results = p.run(cases.closed_in_agreement, 1, timeout=75)
    finally:
        p.kill()
    closing = results[1]
    results[1] = None
    assert_survivors_named_the_dead_rank(results, 1, call="all_reduce #", within_s=10)
    assert closing < 10, f"the leaver's close took {closing:.1f} s"
