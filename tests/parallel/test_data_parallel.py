"""DataParallel: equivalence with single-process training, no_sync, overlap, errors.

Tolerance: see tests/parallel/dp_cases.py (1e-5 relative per tensor; fp32, different summation
order only). Parameters must be bitwise equal across ranks after every step.
"""
import pytest

from parallel import dp_cases as C

WORLDS = [2, 3, 4]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_matches_single_process(pool, world, model):
    res = pool(world).run(C.train_equivalence, "dp", model)
    C.assert_equivalent(res, what=f"DataParallel {model} on {world} ranks")


@pytest.mark.timeout(120)
def test_algorithm_selectable(pool):
    res = pool(2).run(C.train_equivalence, "dp", "mlp", steps=3, algorithm="ring")
    C.assert_equivalent(res, what="DataParallel(algorithm='ring')")


@pytest.mark.timeout(120)
def test_gradient_as_bucket_view(pool):
    res = pool(3).run(C.train_equivalence, "dp", "transformer", steps=4,
                      gradient_as_bucket_view=True)
    C.assert_equivalent(res, what="DataParallel(gradient_as_bucket_view=True)")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_no_sync_accumulation_equals_large_batch(pool, world):
    res = pool(world).run(C.no_sync_accumulation, 4)
    C.assert_equivalent(res, what=f"no_sync over 4 micro-batches on {world} ranks")


@pytest.mark.timeout(60)
def test_no_sync_does_not_communicate(pool):
    digests = pool(2).run(C.no_sync_is_local)
    assert digests[0] != digests[1], "gradients were synchronised inside no_sync()"


@pytest.mark.timeout(60)
def test_buckets_overlap_backward(pool):
    """Bucket all-reduces are launched from the grad hooks while backward is still running:
    the first launch precedes the moment the last gradient becomes ready."""
    for rank_stats in pool(2).run(C.overlap_stats):
        for st in rank_stats:
            assert st["buckets"] >= 3
            assert st["launched_during_backward"] == st["buckets"]
            assert st["launch_times"][0] < st["last_grad_time"]
            assert sorted(st["launch_times"]) == st["launch_times"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("find_unused", [True, False])
def test_unused_parameters(pool, find_unused):
    res = pool(2).run(C.unused_params, find_unused)
    assert res[0] == res[1]
    assert res[0]["c_none"] is find_unused  # unused everywhere: None, or a zero gradient
    assert res[0]["b_grad"] is not None     # used on rank 0 only: rank 0's gradient / 2


@pytest.mark.timeout(60)
def test_bad_inputs(pool):
    msgs = pool(2).run(C.bad_inputs)
    assert msgs[0] == msgs[1], "ranks disagree on the error"
    m = msgs[0]
    assert "'0.weight'" in m["shape"] and "(4, 8)" in m["shape"] and "(4, 9)" in m["shape"]
    assert "'1.weight'" in m["count"]
    assert m["cap"].startswith("ValueError: bucket_cap_mb")
    assert m["module"].startswith("TypeError: module")
    assert m["comm"].startswith("TypeError: comm")
    assert m["zero_stage"].startswith("ValueError: stage")
    assert m["zero_cls"].startswith("TypeError: optimizer_class")
    assert m["zero_empty"].startswith("ValueError: params")
    assert m["fsdp_mp"].startswith("ValueError: mixed_precision")
    assert m["ps_root"].startswith("ValueError: server_rank")
    assert m["algorithm"].startswith("ValueError: algorithm") and "no_such_algo" in m["algorithm"]
