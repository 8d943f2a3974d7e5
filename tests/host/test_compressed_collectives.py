"""compress= on the host executor (docs/compression.md): every algorithm of all_reduce,
reduce_scatter and all_gather x codec x dtype x awkward count on world sizes 1-5 and 8 (one pool
each), within the stated bound of the exact result and identical bytes on every rank; refused
arguments named."""
import collections

import pytest

import compress_cases as cases

SIZES = [1, 2, 3, 4, 5, 8]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", SIZES)
def test_compressed_matrix(pool, size):
    p = pool(size)
    for collective in ("all_reduce", "reduce_scatter", "all_gather"):
        results = p.run(cases.check_compressed, collective, timeout=240)
        failures = [f for fails, _ in results for f in fails]
        assert not failures, f"{len(failures)} wrong result(s):\n" + "\n".join(failures[:10])
        by_case = collections.defaultdict(set)
        for _, digests in results:
            for case, digest in digests:
                by_case[case].add(digest)
        differing = [c for c, d in by_case.items() if len(d) > 1]
        assert not differing, f"ranks differ bitwise in {len(differing)} case(s), e.g. {differing[:3]}"


def test_refused_arguments_are_named(pool):
    results = pool(2).run(cases.refusals, timeout=60)
    assert all(len(named) == 7 and total == 2.0 for named, total in results), results
