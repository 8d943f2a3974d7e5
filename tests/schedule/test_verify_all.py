"""Every registered algorithm of every collective is verified symbolically at every world size
1..32 and at representatives of each shape class up to the verifier's limit of 64 (SIZES), counts
{0, 1, P-1, P, 13, 97, 64P+7} (zero, tiny, < P, multiple of P, primes, a large non-multiple) and
roots {0, P//2, P-1}, in both buffer layouts (separate and in-place). The one-sided algorithms
(whose hazard proof costs more per rank) take counts {0, P-1, 13} at every size and the full set at
a few (their protocol is the same at every count; zero-length and uneven blocks are what vary).

Why not every size to 64 (issue #36: 86 % of this file's time was sizes 33..64): what a builder
does differently from one world size to another depends on the size's shape (a power of two, one
more or one less than one, a prime, an odd or an even composite, how it splits into hosts of
tests/schedule's maps), and 1..32 holds every such class several times; above 32, each class
again once: 33 (2^5+1), 47 (prime), 48 (3 x 2^4, even, not a power of two), 63 (2^6-1) and 64
(2^6, the verifier's limit)."""
import pytest

import commlib
from commlib.core import schedules

# Every built-in algorithm, from the registry (each builder file registers its own).
EXPECTED = {c: [a["name"] for a in schedules.algorithm_info(c) if "user_defined" not in a["traits"]]
            for c in commlib.COLLECTIVES}
ROOTED = {"broadcast", "reduce", "gather", "scatter"}
CASES = [(c, a) for c, algos in EXPECTED.items() for a in algos]
ONE_SIDED = {(c, a["name"]) for c in commlib.COLLECTIVES for a in schedules.algorithm_info(c)
             if "one_sided" in a["traits"]}


SIZES = list(range(1, 33)) + [33, 47, 48, 63, 64]


def counts(P, one_sided=False):
    if one_sided and P not in (2, 3, 8, 31, 64):
        return sorted({0, max(P - 1, 0), 13})
    return sorted({0, 1, max(P - 1, 0), P, 13, 97, 64 * P + 7})


@pytest.mark.parametrize("collective,algorithm", CASES, ids=[f"{c}-{a}" for c, a in CASES])
def test_verify_all_sizes(collective, algorithm):
    for P in SIZES:
        roots = sorted({0, P // 2, P - 1}) if collective in ROOTED else [0]
        for n in ([0] if collective == "barrier" else counts(P, (collective, algorithm) in ONE_SIDED)):
            for root in roots:
                schedules.verify(collective, algorithm, P, n, root)


@pytest.mark.parametrize("collective", sorted(EXPECTED))
def test_auto_verifies(collective):
    for P in (1, 2, 3, 8, 13):
        for n in ([0] if collective == "barrier" else [0, 5, 1 << 20]):
            schedules.verify(collective, "auto", P, n, P - 1 if collective in ROOTED else 0)


def test_every_collective_has_registered_builders():
    # What the registry collected is what the README lists (a builder file that stops
    # registering, or registers under a new name, shows here).
    assert all(EXPECTED[c] for c in EXPECTED)
    assert EXPECTED["all_reduce"][:3] == ["ring", "recursive_doubling", "rabenseifner"]
    assert sum(len(v) for v in EXPECTED.values()) >= 29
