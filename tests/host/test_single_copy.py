"""Single-copy reads between ranks of one host (COMMLIB_CMA; docs/transports.md "Single-copy
reads"): the collective matrix's small and awkward counts with them forced on for every message of
8 bytes or more, on 5 ranks (2 cores: oversubscribed; the ~1M-element counts run single-copy in
test_collectives.py's test_single_copy_rendezvous, and with the tuning file's crossovers in the
default matrix), forced off, buffers that change between calls, in-place all_to_all (direct: received
into scratch and copied back; pairwise: sent from the core's own input copy) on growing buffers, a sender that dies after
publishing its buffer's address, and a reader held at its read while the sender fails for another rank's death."""
import os

import pytest

import collective_cases as cases
import single_copy_cases as sc
from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank
from test_collectives import _check_identical

FORCED = {"COMMLIB_CMA": "8"}  # every message of 8 bytes or more goes single-copy


@pytest.mark.timeout(300)
@pytest.mark.parametrize("collective", ["all_to_all", "all_gather", "broadcast", "all_reduce"])
def test_matrix_with_single_copy_forced(pool, collective):
    p = pool(5, env=FORCED)
    read, reason, smallest = zip(*p.run(sc.direct_reads))
    assert all(read), f"single-copy reads refused here: {reason}"
    assert set(smallest) == {8}
    results = p.run(cases.check_collective, collective, False, True, timeout=240)
    failures = [f for fails, _ in results for f in fails]
    assert not failures, f"{len(failures)} wrong result(s):\n" + "\n".join(failures[:20])
    _check_identical([d for _, d in results])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_all_to_all_matrix_with_single_copy_forced_at_every_world_size(pool, size):
    """all_to_all is the collective the shipped table (commlib/core/tuning.json) sends single-copy at 4
    and 8 ranks from 16 MiB send buffers: its matrix with every message single-copy at the other world
    sizes (5 above), 8 ranks on 2 cores included."""
    p = pool(size, env=FORCED)
    assert all(read for read, _, _ in p.run(sc.direct_reads)) or size == 1
    results = p.run(cases.check_collective, "all_to_all", False, True, timeout=240)
    failures = [f for fails, _ in results for f in fails]
    assert not failures, f"{len(failures)} wrong result(s):\n" + "\n".join(failures[:20])
    _check_identical([d for _, d in results])


@pytest.mark.parametrize("size,env", [(5, FORCED), (3, {"COMMLIB_CMA": "1"}), (3, {"COMMLIB_CMA": "0"})])
def test_buffers_that_change_between_calls(pool, size, env):
    assert pool(size, env=env).run(sc.changing_buffers, timeout=120) == [[]] * size


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size,env", [(4, FORCED), (3, {"COMMLIB_CMA": "0"})])
def test_in_place_all_to_all_on_growing_buffers(pool, size, env):
    assert pool(size, env=env).run(sc.in_place_all_to_all_growing, timeout=150) == [[]] * size


def test_forced_off_says_why(pool):
    read, reason, smallest = zip(*pool(3, env={"COMMLIB_CMA": "0"}).run(sc.direct_reads))
    assert read == (False,) * 3 and reason == ("COMMLIB_CMA=0",) * 3 and smallest == (-1,) * 3


@pytest.mark.timeout(120)
def test_sender_dying_after_publishing_its_buffer_raises_peer_error():
    results = run_killing_one_rank(3, 1, sc.sender_dies_after_publishing, env=FORCED, timeout=60)
    assert_survivors_named_the_dead_rank(results, 1, call="broadcast #", within_s=20)
    assert all("could not be read" in res[0] for q, res in enumerate(results) if q != 1), results


@pytest.mark.timeout(120)
def test_all_to_all_sender_dying_after_publishing_raises_peer_error():
    """all_to_all single-copy: every survivor reads the dead rank's blocks (and waits for its reads
    of theirs): PeerError naming it and the call, never a crash of the reader or a hang."""
    results = run_killing_one_rank(4, 2, sc.sender_dies_after_publishing, env=FORCED, timeout=60,
                                   args=("all_to_all",))
    assert_survivors_named_the_dead_rank(results, 2, call="all_to_all #", within_s=20)
    # the first survivor to look failed in its read of the dead rank's buffer (the others learn it
    # from that survivor's published failure or from their own read)
    assert any("could not be read" in res[0] for q, res in enumerate(results) if q != 2), results


@pytest.mark.timeout(120)
def test_read_of_a_sender_that_failed_names_the_first_failure(tmp_path):
    """7604be4, deterministically: the reader is held (_C.hold_next_single_copy_read) between the
    sender's publication and its read while rank 2 dies and the sender, whose call failed for it,
    unmaps its buffer: the reader's failed read must name rank 2's death, not only rank 1."""
    gate = str(tmp_path / "gate")
    results = run_killing_one_rank(3, 2, sc.read_after_sender_failed, env=FORCED, timeout=90, args=(gate,))
    reader, sender_result, dead = results
    assert dead is None and sender_result is not None and not os.path.exists(gate), results
    sender, unmapped = sender_result
    assert unmapped, "the sender's buffer was still referenced: the reader's read would succeed"
    assert sender is not None and "rank 2" in sender[0] and "all_to_all #" in sender[0], sender
    assert reader is not None, "the reader's call succeeded"
    msg = reader[0]
    assert "rank 1" in msg and "could not be read" in msg and "all_to_all #" in msg, msg
    assert "rank 2" in msg, f"the reader blamed only the live rank 1: {msg}"


@pytest.mark.timeout(180)
def test_a_rank_publishes_every_single_copy_send_of_a_step_before_it_reads(pool, tmp_path):
    """hierarchical all_gather's step on one host lists [send q, recv q] per local peer, and a
    single-copy receive reads its whole block before the executor moves on: rank 1, held at its read
    of rank 0's block, must already have published its own block to rank 2, which then reaches its
    read of it (csrc/host/executor.cc progress: sends first). Before, rank 2 saw nothing of rank 1
    until rank 1's read was done."""
    import threading
    import time
    first, second = str(tmp_path / "r1_reads_0"), str(tmp_path / "r2_reads_1")
    seen = {}

    def hold_rank_1():
        deadline = time.monotonic() + 60
        while not os.path.exists(first) and time.monotonic() < deadline:
            time.sleep(0.001)
        seen["rank 1 held"] = os.path.exists(first)
        deadline = time.monotonic() + 5  # rank 1 stays held this long at most
        while not os.path.exists(second) and time.monotonic() < deadline:
            time.sleep(0.001)
        seen["rank 2 reached rank 1's block meanwhile"] = os.path.exists(second)
        for path in (first, second):  # let both go (rank 2's gate appears later in the other order)
            deadline = time.monotonic() + 60
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.001)
            if os.path.exists(path):
                os.unlink(path)

    watcher = threading.Thread(target=hold_rank_1, daemon=True)
    watcher.start()
    results = pool(4, env=FORCED).run(sc.gated_hierarchical_all_gather, first, second, timeout=150)
    watcher.join(timeout=70)
    assert results == [True] * 4
    assert seen == {"rank 1 held": True, "rank 2 reached rank 1's block meanwhile": True}, seen
