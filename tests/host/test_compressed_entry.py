"""Host collectives with compress= through the C++ entry (issue #37, item 2;
csrc/bindings/host_compressed_calls.cc): after the Python path resolved a call's codec (and auto's
algorithm under the verifier) once, later blocking calls of that key run from C++, bit for bit
what the Python path gives, at 2 and 3 ranks, awkward counts, two dtypes and codecs; a wrong
argument after hits still raises naming it, and a closed communicator's entries are never used."""
import pytest

import compressed_entry_cases as cases


@pytest.mark.parametrize("P", [2, 3])
def test_repeated_compressed_host_calls_run_from_the_entry(pool, P):
    k = 4
    for out in pool(P).run(cases.compressed_calls_from_the_entry, k, timeout=120):
        assert len(out) == 3 * 3 * 2 * 2, len(out)
        for case, resolutions, hits, right in out:
            # k resolutions: the Python path's own calls (a fresh codec each); none for the entry's
            assert (resolutions, hits, right) == (0, k, True), (case, resolutions, hits, right)


def test_a_wrong_argument_after_compressed_hits_raises_naming_it(pool):
    for out in pool(2).run(cases.compressed_entry_refusals, timeout=60):
        assert [c for c, *_ in out] == ["op", "out", "algorithm", "closed"], out
        by_case = {c: (t, m, hits) for c, t, m, hits, _ in out}
        dropped = {c: d for c, *_, d in out}
        # the closed communicator's entry is dropped at its next lookup, never run
        assert dropped == {"op": 0, "out": 0, "algorithm": 0, "closed": 1}, dropped
        assert by_case["op"][:2] == ("ValueError", by_case["op"][1]) and by_case["op"][1].startswith("op:"), by_case
        assert by_case["out"][1].startswith("out:"), by_case
        assert by_case["algorithm"][1].startswith("algorithm: unknown all_reduce algorithm 'nope'"), by_case
        assert by_case["closed"][0] is not None, by_case  # the Python path's error, not a call on a closed core
        assert all(hits == 0 for _, _, hits in by_case.values()), by_case
