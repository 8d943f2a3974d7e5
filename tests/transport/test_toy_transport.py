"""A third kind of transport is a folder and a row (issue #36, step 4): the toy kind
(csrc/transport/toy), registered from the test, carries every pair of a sub-communicator through
links of its own class, with no edit to the table, the Fabric or the executor; withdrawn, the
table is shm and tcp again."""
import pytest

import toy_transport_cases as cases


@pytest.mark.timeout(120)
def test_a_registered_kind_carries_the_pairs(pool):
    p = pool(3)
    for rank, (kinds, chunks, kinds_after, table) in enumerate(p.run(cases.collectives_over_the_toy, timeout=100)):
        assert kinds == ["self" if q == rank else "toy" for q in range(3)], (rank, kinds)
        assert chunks > 0, f"rank {rank}: no chunk went through the toy's links"
        assert kinds_after == ["self" if q == rank else "shm" for q in range(3)], (rank, kinds_after)
        assert table == ["shm", "tcp"]
