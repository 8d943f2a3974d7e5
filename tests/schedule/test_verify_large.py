"""The verifier past 64 ranks (contributor sets are interned interval lists, not a 64-bit mask):
the common algorithms are proven at 1024 ranks (ring at 256: its proof plays ~2P^2 transfers, 12 s
at 1024), and errors at large sizes still name the ranks involved."""
import pytest

import commlib._C as _C
from commlib.core import schedules
from commlib.core.schedules import VerificationError

FAST_AT_1024 = [("all_reduce", "recursive_doubling"), ("all_reduce", "rabenseifner"), ("all_reduce", "tree"),
                ("all_gather", "recursive_doubling"), ("all_gather", "bruck"),
                ("reduce_scatter", "recursive_halving"), ("broadcast", "binomial"),
                ("reduce", "binomial"), ("barrier", "dissemination")]


@pytest.mark.parametrize("collective,algorithm", FAST_AT_1024, ids=[f"{c}-{a}" for c, a in FAST_AT_1024])
def test_common_algorithms_at_1024_ranks(collective, algorithm):
    for P in (1024, 1000):  # a power of two and a folded size
        n = 0 if collective == "barrier" else 3 * P + 5
        schedules.verify(collective, algorithm, P, n, P - 1 if collective in ("broadcast", "reduce") else 0)


@pytest.mark.parametrize("collective,algorithm", [("all_reduce", "ring"), ("all_gather", "ring"),
                                                  ("reduce_scatter", "ring"), ("all_to_all", "pairwise"),
                                                  ("broadcast", "scatter_allgather")])
def test_ring_family_past_64(collective, algorithm):
    for P in (65, 200):
        schedules.verify(collective, algorithm, P, 2 * P + 1)


def test_errors_past_64_name_ranks():
    P = 130
    s = [schedules.schedule("all_reduce", "ring", r, P, P) for r in range(P)]
    for x in s:
        x["steps"].pop()  # drop the last all-gather step everywhere
    with pytest.raises(VerificationError, match=r"expected reduction over ranks \{0\.\.129\} of input\[\d+\], "
                                                r"got reduction over ranks \{"):
        _C._verify_custom(_C.Collective.all_reduce, P, P, s, 0, None)


def test_size_limit():
    with pytest.raises(ValueError, match=r"^size: the verifier supports 1\.\.16384 ranks, got 16385"):
        schedules.verify("all_reduce", "ring", 16385, 1)
