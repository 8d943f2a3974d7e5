"""Device plans (the kernel path's lowering of a schedule, csrc/kernels/device_plan.h) are checked
against their schedules in the verifier's sweep: every built-in algorithm of every collective, every
world size 1..64 (as tests/schedule/test_verify_all.py), counts {0, 1, P-1, 13, 64P+7}, roots
{0, P//2, P-1}: each rank's plan covers exactly its schedule's messages and regions, step for step,
in the kernel's order, and what every rank sends each peer (chunk by chunk) is what that peer
receives. Small chunks (64 bytes up to 12 ranks, 1 KiB beyond) make large messages several chunks;
256 KiB (the default slot) keeps them whole. The whole sweep takes about 4 s of CPU (the check
allocates nothing per step and pairs the ranks' chunks through flat arrays). The checker is shown to catch
altered plans. One-sided schedules (get/put/signal/wait over mapped buffers) lower to one-sided
plans (csrc/kernels/one_sided_plan.h), checked the same way plus signals against waits per tag and
block locality across the ranks."""
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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collective,algorithm", ONE_SIDED, ids=[f"{c}-{a}" for c, a in ONE_SIDED])
def test_one_sided_plans_equal_their_schedules(collective, algorithm):
    """Every rank's plan of a one-sided schedule is its schedule (waits, data items tiling each
    operation's regions, signals, in the kernel's order); across the ranks every wait has its
    signal per (peer, tag), and block locality holds out of place and in place (one_sided_plan.h)."""
    assert len(ONE_SIDED) >= 5
    for P in SIZES:
        for n in counts(P):
            _C.check_device_plans(COLLECTIVE[collective], algorithm, P, n, 0, esize=2, chunk_bytes=64)
    plan, _ = _plan(collective=collective, algorithm=algorithm, size=4, count=8)
    assert plan["one_sided"] and plan["peer_bufs"] & 1  # every one reads peers' inputs
    kinds = {it["kind"] for it in plan["items"]}
    assert {"signal", "wait"} <= kinds and kinds & {"get", "get_reduce", "put", "reduce_to_all", "reduce_from_all"}


def _one_sided(**kw):
    return _plan(**dict(dict(algorithm="mapped_two_shot", count=10, size=3), **kw))


@pytest.mark.parametrize("change", ["drop_signal", "drop_wait", "tag", "peer", "offset", "order", "bytes", "kind"])
def test_the_checker_catches_an_altered_one_sided_plan(change):
    plan, args = _one_sided()
    assert _check(plan, args) == ""
    bad = copy.deepcopy(plan)
    items, steps = bad["items"], bad["steps"]
    at = {k: next(i for i, it in enumerate(items) if it["kind"] == k) for k in ("signal", "wait", "get_reduce")}

    def drop(i):
        del items[i]
        bad["steps"] = [(f - (f > i), c - (f <= i < f + c)) for f, c in steps]
    if change == "drop_signal":  # a plan with a missing signal is not its schedule
        drop(at["signal"])
    elif change == "drop_wait":
        drop(at["wait"])
    elif change == "tag":
        items[at["signal"]]["chunk"] = 3
    elif change == "peer":
        items[at["get_reduce"]]["peer"] = 1 - items[at["get_reduce"]]["peer"] + 1
    elif change == "offset":
        items[at["get_reduce"]]["src_off"] += 4
    elif change == "order":  # a signal before the step's data
        g = at["get_reduce"]
        items[g], items[g + 2] = items[g + 2], items[g]
    elif change == "bytes":
        items[at["get_reduce"]]["bytes"] -= 4
    elif change == "kind":
        items[at["get_reduce"]]["kind"] = "get"
    assert _check(bad, args) != "", change


@pytest.mark.parametrize("change", ["offset", "bytes", "kind", "peer", "drop"])
def test_the_checker_catches_an_altered_fused_plan(change):
    plan, args = _one_sided(algorithm="mapped_fused_two_shot")
    assert _check(plan, args) == ""
    bad = copy.deepcopy(plan)
    items = bad["items"]
    i = next(k for k, it in enumerate(items) if it["kind"] == "reduce_to_all")
    if change == "offset":
        items[i]["dst_off"] += 4
    elif change == "bytes":
        items[i]["bytes"] -= 4
    elif change == "kind":  # the fused item is not a get_reduce of one peer
        items[i]["kind"], items[i]["peer"] = "get_reduce", 0
    elif change == "peer":
        items[i]["peer"] = 0
    elif change == "drop":
        del items[i]
        bad["steps"] = [(f - (f > i), c - (f <= i < f + c)) for f, c in bad["steps"]]
    assert _check(bad, args) != "", change


def test_block_locality_counts_the_fused_item_on_every_rank():
    """A reduce_to_all touches its range of every rank's buffers: a peer's get of rank 0's whole
    output, which the fused items write in blocks, is not block-local (nor race-free)."""
    s = _scheds("all_reduce", "mapped_fused_two_shot", 2, 8)
    _C.check_one_sided_plans(COLLECTIVE["all_reduce"], s, 8, esize=4)
    s[1]["steps"][-1].append({"op": "get", "peer": 0, "dst": ("output", 0, 8), "src": ("output", 0, 8)})
    with pytest.raises(RuntimeError, match="block locality: rank 0's output bytes"):
        _C.check_one_sided_plans(COLLECTIVE["all_reduce"], s, 8, esize=4)


def test_block_locality_counts_the_fused_reduce_scatter_source_on_every_rank():
    """A reduce_from_all reads its range of every rank's input (and writes this rank's output only):
    a peer's get of part of rank 0's input block 1, which rank 1's fused item reads whole, is not
    block-local."""
    s = _scheds("reduce_scatter", "mapped_fused", 2, 8)
    _C.check_one_sided_plans(COLLECTIVE["reduce_scatter"], s, 8, esize=4)
    plan, _ = _plan(collective="reduce_scatter", algorithm="mapped_fused", size=2, count=8)
    assert plan["peer_bufs"] == 1  # the input only: nobody else touches a rank's output
    s[1]["steps"][-1].append({"op": "get", "peer": 0, "dst": ("output", 0, 4), "src": ("input", 10, 4)})
    with pytest.raises(RuntimeError, match="block locality: rank 0's input bytes"):
        _C.check_one_sided_plans(COLLECTIVE["reduce_scatter"], s, 8, esize=4)


def _scheds(collective, algorithm, size, count):
    return [schedules.schedule(collective, algorithm, r, size, count) for r in range(size)]


def test_a_missing_signal_is_rejected_across_ranks_and_by_the_verifier():
    """Rank 1 never tells rank 0 its buffers are in the call: the verifier rejects the schedule
    (tests/schedule/test_one_sided.py), and its plans fail the pair check, since rank 0 waits for a
    signal nobody sends (each rank's plan alone is still its schedule)."""
    s = _scheds("all_gather", "mapped", 3, 4)
    _C.check_one_sided_plans(COLLECTIVE["all_gather"], s, 4, esize=4)
    s[1]["steps"][0] = [o for o in s[1]["steps"][0] if not (o["op"] == "signal" and o["peer"] == 0)]
    with pytest.raises(commlib.VerificationError):
        _C._verify_custom(COLLECTIVE["all_gather"], 3, 4, s, 0, None)
    with pytest.raises(RuntimeError, match=r"rank 1 signals rank 0 \(tag 0\) fewer times than that rank waits"):
        _C.check_one_sided_plans(COLLECTIVE["all_gather"], s, 4, esize=4)


def test_block_locality_is_checked():
    """Per-block flags are sound only when items touching the same bytes address the same range:
    a rank that copies its input in two halves while peers read it whole is refused."""
    s = _scheds("all_gather", "mapped", 2, 8)
    step = s[0]["steps"][0]
    copy_op = next(o for o in step if o["op"] == "copy")
    step.remove(copy_op)
    step += [{"op": "copy", "dst": ("output", 0, 4), "src": ("input", 0, 4)},
             {"op": "copy", "dst": ("output", 4, 4), "src": ("input", 4, 4)}]
    _C._verify_custom(COLLECTIVE["all_gather"], 2, 8, s, 0, None)  # a correct schedule ...
    with pytest.raises(RuntimeError, match="block locality: rank 0's input bytes"):  # ... no per-block plan
        _C.check_one_sided_plans(COLLECTIVE["all_gather"], s, 8, esize=4)


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


# Host maps for the multi-host shapes (rail_halving pairs its lanes on equal power-of-two hosts,
# rail_lanes runs lanes there; elsewhere both are hierarchical rabenseifner/ring).
HOST_MAPS = [[h for h in range(H) for _ in range(L)] for H, L in ((2, 2), (2, 4), (4, 2), (8, 8))] + [
    [h for h in range(3) for _ in range(3)], [0, 0, 1, 2, 2, 2], [1, 0, 1, 0, 2, 2]]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm,pieces", [("hierarchical", 0), ("rail_halving", 0), ("rail_lanes", 2),
                                              ("rail_lanes", 4), ("rail_window", 0), ("rail_window", 3)])
def test_multi_host_plans_equal_their_schedules(algorithm, pieces):
    """The pipelined multi-host shapes on host maps (check_device_plans' hosts): 1 to 16 segments,
    2 and 4 lanes, a lane per segment under a window (rail_window: pieces is its window; the plan
    runs the list in order), awkward counts; each plan is its schedule and the pairs agree across
    ranks."""
    for hosts in HOST_MAPS:
        P = len(hosts)
        for n, segment in ((0, 0), (1, 1), (P - 1, 1), (97, 7), (64 * P + 7, 8 * P)):
            _C.check_device_plans(COLLECTIVE["all_reduce"], algorithm, P, n, 0, esize=2, chunk_bytes=64, hosts=hosts,
                                  segment=segment, pieces=pieces)


def test_multi_host_plans_checker_sees_the_host_map():
    """The host map reaches the builder: the chunks checked across hosts are rail_halving's inter-host
    messages (2 log2 H steps a segment, half then a quarter .. of a block each way: 2 (H-1)/H of
    the block, in 64-byte chunks of 2-byte elements); none on one host; a mismatched map is refused
    by name."""
    hosts = [0] * 4 + [1] * 4  # 2 hosts of 4: each rank's block of a segment 1/8, half of it across
    n = 8 * 32 * 4  # 4 segments of 256 elements: blocks of 32, 16 across each way = 32 B, one chunk
    across = _C.check_device_plans(COLLECTIVE["all_reduce"], "rail_halving", 8, n, 0, esize=2, chunk_bytes=64,
                                   hosts=hosts, segment=n // 4)
    assert across == 8 * 4 * 2, across  # every rank, every segment, one message each way
    assert _C.check_device_plans(COLLECTIVE["all_reduce"], "rail_halving", 8, n, 0, esize=2, chunk_bytes=64) == 0
    with pytest.raises(ValueError, match="hosts: 3 entries for 8 ranks"):
        _C.check_device_plans(COLLECTIVE["all_reduce"], "rail_halving", 8, 64, 0, hosts=[0, 0, 1])
