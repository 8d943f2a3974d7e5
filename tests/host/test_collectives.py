"""Real multi-process collectives: every collective x algorithm x dtype x op x count x root, in and
out of place, world sizes 1, 2, 3, 4, 5, 8, each world size in one pool of rank processes (the full
product or a covering selection at each world size: matrix_selection.py says which)."""
import collections

import pytest

import collective_cases as cases
import p2p_cases

SIZES = [1, 2, 3, 4, 5, 8]
COLLECTIVES = ["all_reduce", "reduce_scatter", "reduce", "all_gather", "all_to_all", "broadcast",
               "gather", "scatter", "barrier"]


def _check_identical(per_rank_digests):
    """Outputs every rank must hold identically must have identical bytes."""
    by_case = collections.defaultdict(set)
    for digests in per_rank_digests:
        for case, digest in digests:
            by_case[case].add(digest)
    differing = [case for case, ds in by_case.items() if len(ds) > 1]
    assert not differing, f"ranks differ bitwise in {len(differing)} case(s), e.g. {differing[:3]}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_collective_matrix(pool, size, collective):
    results = pool(size).run(cases.check_collective, collective, timeout=540)
    failures = [f for fails, _ in results for f in fails]
    assert not failures, f"{len(failures)} wrong result(s):\n" + "\n".join(failures[:20])
    _check_identical([d for _, d in results])


@pytest.mark.parametrize("size", [2, 3, 5])
def test_point_to_point(pool, size):
    failures = [f for fails in pool(size).run(cases.check_p2p) for f in fails]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("slot", [None, "4096"], ids=["default", "small_slots"])
def test_several_messages_to_one_peer_in_one_batch(pool, size, slot):
    p = pool(size) if slot is None else pool(size, env={"COMMLIB_SHM_SLOT_BYTES": slot})
    failures = [f for fails in p.run(p2p_cases.several_messages_to_one_peer) for f in fails]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("size", [2, 3])
def test_several_messages_to_one_peer_keep_their_order_over_stuttering_links(pool, size):
    """The same batch over links where every other slot and chunk is late (the toy transport's
    stutter): it fails with the executor's per-peer order (ExecOp::after) disabled."""
    failures = [f for fails in pool(size).run(p2p_cases.several_messages_over_stuttering_links, timeout=100)
                for f in fails]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("size", [1, 3, 4])
def test_async_calls_complete_in_order(pool, size):
    assert pool(size).run(cases.check_async_order) == [[]] * size


@pytest.mark.parametrize("size", [2, 3])
def test_torch_tensors(pool, size):
    pytest.importorskip("torch")
    assert all(pool(size).run(cases.torch_tensors))


@pytest.mark.timeout(120)
def test_eight_ranks_on_two_cores_do_not_collapse(pool):
    """1000 small all_reduces on 8 ranks pinned to two cores: every rank gets every call's result
    right, and the run makes progress (a busy-waiting executor, holding the cores the awaited rank
    needs, takes minutes and meets the call's timeout: a hang guard, not a measured time; the speed
    itself is measured by `commlib bench`)."""
    assert pool(8).run(cases.many_small_on_two_cores, 1000, timeout=100) == [[]] * 8


@pytest.mark.timeout(300)
@pytest.mark.parametrize("collective", ["all_reduce", "all_to_all", "broadcast"])
def test_single_copy_rendezvous(pool, collective):
    """COMMLIB_CMA=1: messages larger than a channel go by rendezvous (the receiver reads the
    sender's buffer with process_vm_readv): the matrix's ~1M-element calls, in their each-choice
    covering (every algorithm, dtype, op and root meets them; the small counts' messages, 104
    bytes at most, fit a 4 KiB slot and would repeat the default run), same exact checks."""
    p = pool(3, env={"COMMLIB_CMA": "1", "COMMLIB_SHM_SLOT_BYTES": "4096"})
    assert all(p.run(cases.direct_reads_enabled))
    results = p.run(cases.check_collective, collective, True, timeout=240)
    failures = [f for fails, _ in results for f in fails]
    assert not failures, f"{len(failures)} wrong result(s):\n" + "\n".join(failures[:20])
    _check_identical([d for _, d in results])
    assert p.run(cases.check_p2p) == [[]] * 3


@pytest.mark.timeout(300)
@pytest.mark.parametrize("collective", ["all_gather", "all_to_all", "broadcast", "reduce_scatter"])
def test_streaming_stores(pool, collective):
    """COMMLIB_STREAM_BYTES=1000: calls whose outputs hold 1000 bytes or more (all ranks together)
    write their messages and local copies of 64 KiB or more with non-temporal stores (by default
    only calls of 32 MiB or more do): the matrix's ~1M-element calls, in their each-choice covering
    (every algorithm, dtype and root; the small counts' outputs, 312 bytes at most, never stream
    and would repeat the default run), same exact checks."""
    p = pool(3, env={"COMMLIB_STREAM_BYTES": "1000"})
    results = p.run(cases.check_collective, collective, True, timeout=240)
    failures = [f for fails, _ in results for f in fails]
    assert not failures, f"{len(failures)} wrong result(s):\n" + "\n".join(failures[:20])
    _check_identical([d for _, d in results])
