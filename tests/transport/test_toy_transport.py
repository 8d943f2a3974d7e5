"""A third kind of transport is a folder and a row (issue #36, step 4): the toy kind
(csrc/transport/toy), registered from the test, carries every pair of a sub-communicator through
links of its own class, with no edit to the table, the Fabric or the executor; withdrawn, the
table is shm and tcp again."""
import pytest

import paired_messages as paired
import toy_transport_cases as cases


@pytest.mark.timeout(120)
def test_a_registered_kind_carries_the_pairs(pool):
    p = pool(3)
    for rank, (kinds, chunks, kinds_after, table) in enumerate(p.run(cases.collectives_over_the_toy, timeout=100)):
        assert kinds == ["self" if q == rank else "toy" for q in range(3)], (rank, kinds)
        assert chunks > 0, f"rank {rank}: no chunk went through the toy's links"
        assert kinds_after == ["self" if q == rank else "shm" for q in range(3)], (rank, kinds_after)
        assert table == ["shm", "tcp"]


@pytest.mark.timeout(120)
def test_a_pairs_messages_in_one_step_keep_op_order(pool):
    """Two sends to and two receives from one peer in a step (ir.h), over links where every other
    send slot (received chunk) is not there yet: neither message takes the other's chunks."""
    got = pool(3).run(paired.paired_over_stuttering_links, 1 << 18, 2, timeout=100)
    assert got == [[0, 0], [0, 0], None]
