"""Peers' buffers, registered lazily (device/peer_buffers.h; issue #38, item 1), on the emulated
device in the device matrix's 2-rank pool (the stream delay on, both ranks on emulated device 0:
two ranks sharing a device, as under MPS). Rank side in peer_buffer_cases.py.

* every rank reads each peer's bytes of the call through the mapping it got, at the call's offset
  inside the allocation; the second lookup of the same buffer is a hit (no wait, no new
  registration or import);
* a buffer freed and allocated again at the SAME address (a new buffer id) is registered afresh and
  mapped afresh on every peer: each reads the new bytes (a registry keyed by address reads the old
  allocation through its stale mapping, which the emulated device keeps alive, as CUDA keeps an
  imported allocation alive until the importer closes it);
* memory without a shareable handle is not mapped (the staged path), on either side;
* a prediction made before a peer reached the call says which buffer it assumed, so a stale one is
  never taken for the peer's current buffer, and the next lookup has learnt the new one;
* the communicator's close drops every registration and mapping."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_buffer_cases as cases  # noqa: E402  (it puts tests/stream on sys.path)
from test_device_collectives import DELAY_ENV  # noqa: E402  (tests/stream: the device matrix's pool)


@pytest.mark.timeout(90)
def test_mapped_in_place_then_freed_and_reallocated_at_the_same_address(pool):
    results = pool(2, env=DELAY_ENV).run(cases.mapped_and_freed, timeout=60)
    for seen, (misses, hits, registered), (retired, registered_after), (regs, imports) in results:
        assert seen == [True, True, True, True], seen
        assert (misses, hits, registered) == (1, 1, 1)
        assert retired >= 1 and registered_after == 2
        assert (regs, imports) == (1, 1)  # the old registration and the peer's old mapping are gone


@pytest.mark.timeout(60)
def test_memory_without_a_shareable_handle_is_staged(pool):
    results = pool(2, env=DELAY_ENV).run(cases.unshareable_is_staged, timeout=40)
    assert results[0][:2] == (True, [False, False]), results
    assert results[1][:2] == (False, [False, False]), results
    assert results[1][2] >= 1


@pytest.mark.timeout(60)
def test_a_stale_prediction_is_flagged_and_then_corrected(pool):
    results = pool(2, env=DELAY_ENV).run(cases.mispredicted_is_flagged, timeout=40)
    assert results[0][0] == [(False, None), (True, 31)], results
    assert results[0][1] >= 1


@pytest.mark.timeout(60)
def test_the_communicators_close_drops_registrations_and_mappings(pool):
    results = pool(2, env=DELAY_ENV).run(cases.closed_with_the_communicator, timeout=40)
    assert results == [((1, 1), (0, 0))] * 2, results


@pytest.mark.timeout(60)
def test_the_symmetric_pool_hands_out_the_same_offsets_on_every_rank(pool):
    assert pool(2, env=DELAY_ENV).run(cases.symmetric_pool, timeout=40) == [[True] * 12] * 2


@pytest.mark.timeout(60)
def test_lookups_and_the_engines_agreed_calls_keep_apart_on_one_registry(pool):
    """PeerBuffers::lookup (keyed by its caller's numbers) and agree (the engine's one-sided calls,
    keyed by the engine's) write rings of their own: a lookup of call 1 never answers the engine's
    agreed call 1, nor the other way round."""
    for rank, (right, seen) in enumerate(pool(2, env=DELAY_ENV).run(cases.lookups_mixed_with_agreed_calls, timeout=50)):
        assert right == [True, True], (rank, right)
        assert seen, rank
