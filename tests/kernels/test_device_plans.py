"""Device plans (the kernel path's lowering of a schedule, csrc/kernels/device_plan.h) are checked
against their schedules in the verifier's sweep: every built-in algorithm of every collective, every
world size 1..64 (as tests/schedule/test_verify_all.py), counts {0, 1, P-1, 13, 64P+7}, roots
{0, P//2, P-1}: each rank's plan covers exactly its schedule's messages and regions, step for step,
in the kernel's order, and what every rank sends each peer (chunk by chunk) is what that peer
receives. Small chunks (64 bytes up to 12 ranks, 1 KiB beyond) make large messages several chunks;
256 KiB (the default slot) keeps them whole. The whole sweep takes about 4 s of CPU (the check
allocates nothing per step and pairs the ranks' chunks through flat arrays). The checker is shown to catch
altered plans. One-sided schedules (get/put/signal/wait over mapped buffers) have no plan yet: the
lowering and the check refuse them, saying why (docs/gpu.md, "Not built yet")."""
import copy

import pytest

import commlib
from commlib import _C, schedules
from commlib.core.call_spec import COLLECTIVE

ROOTED = {"broadcast", "reduce", "gather", "scatter"}
SIZES = range(1, 65)
CASES = [(c, a["name"]) for c in commlib.COLLECTIVES for a in schedules.algorithm_info(c)
         if "user_defined" not in a["traits"] and "one_sided" not in a["traits"]]
ONE_SIDED = [(c, a["name"]) for c in commlib.COLLECTIVES for a in schedules.algorithm_info(c)
             if "one_sided" in a["traits"]]


def counts(P):
    return sorted({0, 1, max(P - 1, 0), 13, 64 * P + 7})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collective,algorithm", CASES, ids=[f"{c}-{a}" for c, a in CASES])
def test_plans_equal_their_schedules(collective, algorithm):
    for P in SIZES:
        roots = sorted({0, P // 2, P - 1}) if collective in ROOTED else [0]
        for n in ([0] if collective == "barrier" else counts(P)):
            for root in roots:
                # esize 2 with small chunks: a 64P+7 message is several chunks, the last partial
                # (64-byte chunks up to 12 ranks, 1 KiB beyond, where the messages are larger).
                _C.check_device_plans(COLLECTIVE[collective], algorithm, P, n, root, esize=2, chunk_bytes=64 if P <= 12 else 1024)
                if P in (1, 2, 3, 8, 64):
                    _C.check_device_plans(COLLECTIVE[collective], algorithm, P, n, root, esize=8, chunk_bytes=262144)


@pytest.mark.parametrize("collective,algorithm", ONE_SIDED, ids=[f"{c}-{a}" for c, a in ONE_SIDED])
def test_one_sided_schedules_are_refused_with_the_reason(collective, algorithm):
    assert len(ONE_SIDED) >= 5
    reason = r"one-sided operations \(get, get_reduce, put, signal, wait: ir\.h\) have no device plan yet"
    for P in (2, 3, 8, 64):
        for n in (0, 1, 13):
            with pytest.raises(ValueError, match=reason):
                _C.check_device_plans(COLLECTIVE[collective], algorithm, P, n, 0, esize=4, chunk_bytes=1024)
    with pytest.raises(ValueError, match=reason):
        _plan(collective=collective, algorithm=algorithm, size=4, count=8)
    # One rank needs no peer: the schedule is a local copy, which a plan carries.
    _C.check_device_plans(COLLECTIVE[collective], algorithm, 1, 13, 0, esize=4, chunk_bytes=1024)


def _plan(**kw):
    args = dict(collective="all_reduce", algorithm="ring", rank=1, size=4, count=1000, root=0, esize=4,
                chunk_bytes=256)
    args.update(kw)
    return _C.device_plan(**dict(args, collective=COLLECTIVE[args["collective"]])), args


def _check(plan, args):
    return _C.check_device_plan(plan, COLLECTIVE[args["collective"]], args["algorithm"], args["rank"], args["size"],
                                args["count"], args["root"])


def test_a_plan_has_the_kernel_order_and_chunks():
    plan, args = _plan()
    assert _check(plan, args) == ""
    # ring all_reduce on 4 ranks: 2(P-1) steps, each one send to rank 2 and one receive from rank 0
    assert len(plan["steps"]) == 6
    first, n = plan["steps"][0]
    kinds = [(it["kind"], it["chunk"]) for it in plan["items"][first:first + n]]
    assert kinds[:2] == [("send", 0), ("recv_reduce", 0)]  # chunk 0 of the send, then of the receive
    assert plan["sends_to"][2] == plan["recvs_from"][0] > 0 and plan["reduces"]


@pytest.mark.parametrize("change", ["drop", "offset", "order", "chunk", "peer", "bytes", "totals", "buffer"])
def test_the_checker_catches_an_altered_plan(change):
    plan, args = _plan()
    bad = copy.deepcopy(plan)
    first, n = bad["steps"][1]
    items = bad["items"]
    if change == "drop":
        del items[first + n - 1]
        bad["steps"] = [(f, c - (1 if i == 1 else 0)) if i <= 1 else (f - 1, c)
                        for i, (f, c) in enumerate(bad["steps"])]
    elif change == "offset":
        items[first]["src_off"] += 4
    elif change == "order":
        items[first], items[first + 1] = items[first + 1], items[first]
    elif change == "chunk":
        items[first]["chunk"] += 1
    elif change == "peer":
        items[first]["peer"] = 3
    elif change == "bytes":
        items[first]["bytes"] -= 4
    elif change == "totals":
        bad["sends_to"][2] += 1
    elif change == "buffer":
        items[first]["src_buf"] = 2  # scratch instead of the input/output
    assert _check(bad, args) != "", change
