"""compress_inter_only (docs/compression.md): on 2 emulated hosts x 2 ranks the intra-host
messages travel raw and the inter-host ones encoded, every rank ends identical and within the
bound; on one host the result is the uncompressed one."""
import collections

import pytest

import compress_hosts_cases as cases

LOOPBACK = {"COMMLIB_SOCKET_IFNAME": "lo"}
TWO_BY_TWO = ("a", "a", "b", "b")


@pytest.mark.timeout(200)
def test_inter_only_across_two_hosts(pool):
    results = pool(4, env={**LOOPBACK, "COMMLIB_HOST_ID": TWO_BY_TWO}).run(cases.across_hosts, timeout=180)
    failures = [f for fails, _, _ in results for f in fails]
    assert not failures, "\n".join(failures[:10])
    by_case = collections.defaultdict(set)
    for _, digests, _ in results:
        for case, digest in digests:
            by_case[case].add(digest)
    differing = [c for c, d in by_case.items() if len(d) > 1]
    assert not differing, f"ranks differ bitwise in {differing[:5]}"
    inexact = set(results[0][2])
    # the inter-host messages were encoded: int4 leaves every n > 1 case inexact
    assert all(f"all_reduce {a} int4 n={n}" in inexact for a in ("auto", "hierarchical") for n in (37, 1000))


@pytest.mark.timeout(120)
def test_inter_only_on_one_host_encodes_nothing(pool):
    assert pool(3).run(cases.one_host_is_exact, timeout=100) == [[]] * 3
