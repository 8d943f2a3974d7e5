"""compress= streams (host/compressed_lowering.cc, docs/compression.md "Streaming"): coded in
pieces, a message carries exactly the values of the message coded whole, so every collective's
output is bitwise the same for every piece size and on every rank; ranks whose piece sizes differ
meet in a MismatchError naming compress=. (The matrix of test_compressed_collectives.py runs with
one-block pieces.)"""
import collections

import pytest

import streaming_cases as cases


@pytest.mark.timeout(180)
def test_pieces_change_no_bit(pool):
    results = pool(4).run(cases.digests_by_piece, timeout=150)
    by_case = collections.defaultdict(set)
    for per_rank in results:
        assert set(per_rank) == set(cases.PIECES)
        for rows in per_rank.values():
            for case, digest in rows:
                by_case[case].add(digest)
    assert len(by_case) >= 3 * len(cases.CODECS)  # every collective ran with every codec
    differing = sorted(c for c, d in by_case.items() if len(d) > 1)
    assert not differing, f"{len(differing)} case(s) differ between piece sizes or ranks, e.g. {differing[:4]}"


def test_piece_sizes_must_agree(pool):
    assert all(pool(2).run(cases.mismatched_pieces, timeout=60))
