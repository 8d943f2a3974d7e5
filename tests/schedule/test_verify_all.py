"""Every registered algorithm of every collective is verified symbolically for world sizes 1..64,
counts {0, 1, P-1, P, 13, 97, 64P+7} (zero, tiny, < P, multiple of P, primes, a large non-multiple)
and roots {0, P//2, P-1}, in both buffer layouts (separate and in-place). The one-sided algorithms
(whose hazard proof costs more per rank) take counts {0, P-1, 13} at every size and the full set at
a few (their protocol is the same at every count; zero-length and uneven blocks are what vary).

Above 32 ranks (86 % of the time when every count ran at every size; issue #36) each (algorithm,
world size) takes one of its counts, rotating with the size and the algorithm, so that every
(algorithm, count class) still meets several world sizes above 32 (COVERED_ABOVE_32 checks); up to
32 ranks and at the few full sizes, every count runs."""
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


FULL_SIZES = (2, 3, 8, 31, 64)  # every count for every algorithm, one-sided ones included
COVERED_ABOVE_32 = 3  # the least number of world sizes above 32 at which each (algorithm, count class) runs


def counts(P, one_sided=False, turn=0):
    """The counts verified at world size P; above 32 ranks (but FULL_SIZES) one of them, the
    ``turn``-th (the caller rotates it with P and the algorithm)."""
    if one_sided and P not in FULL_SIZES:
        every = sorted({0, max(P - 1, 0), 13})
    else:
        every = sorted({0, 1, max(P - 1, 0), P, 13, 97, 64 * P + 7})
    if P <= 32 or P in FULL_SIZES:
        return every
    return [every[turn % len(every)]]


def plan(collective, algorithm):
    """[(P, count)] for every world size 1..64: what test_verify_all_sizes verifies."""
    turn0 = CASES.index((collective, algorithm))
    return [(P, n) for P in range(1, 65)
            for n in ([0] if collective == "barrier" else counts(P, (collective, algorithm) in ONE_SIDED, turn0 + P))]


@pytest.mark.parametrize("collective,algorithm", CASES, ids=[f"{c}-{a}" for c, a in CASES])
def test_verify_all_sizes(collective, algorithm):
    for P, n in plan(collective, algorithm):
        for root in (sorted({0, P // 2, P - 1}) if collective in ROOTED else [0]):
            schedules.verify(collective, algorithm, P, n, root)


def test_every_algorithm_meets_every_world_size_and_count_class():
    """The plan above: every (algorithm, P) for P = 1..64; every count at P <= 32; above 32, every
    (algorithm, count class) at COVERED_ABOVE_32 world sizes or more."""
    def count_class(P, n):
        return {0: "0", 1: "1", P - 1: "P-1", P: "P", 13: "13", 97: "97"}.get(n, "64P+7")
    for c, a in CASES:
        got = plan(c, a)
        assert sorted({P for P, _ in got}) == list(range(1, 65)), (c, a)
        for P in range(1, 33):
            assert sorted(n for q, n in got if q == P) == ([0] if c == "barrier" else counts(P, (c, a) in ONE_SIDED)), (c, a, P)
        if c == "barrier":
            continue
        above = [(P, count_class(P, n)) for P, n in got if P > 32]
        for k in {count_class(33, n) for n in counts(33, (c, a) in ONE_SIDED)}:  # the rotating classes
            assert sum(1 for P, kc in above if kc == k) >= COVERED_ABOVE_32, (c, a, k, above)


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
