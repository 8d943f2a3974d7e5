"""One-sided schedules (docs/DESIGN.md, "The schedule IR"): the mapped builders' registration and
shape, and the verifier's hazard proofs. Each hazard case breaks a correct one-sided schedule by
hand (a missing "ready" signal, a missing release, an overwrite while peers still read, a racing
put, an unbalanced flag) and sees VerificationError name the rank, the region and the hazard. The
sweep over P = 1..64 and awkward counts is tests/schedule/test_verify_all.py's (with the NumPy
cross-check in test_numeric_exec.py)."""
import pytest

import commlib
import commlib._C as _C
from commlib.core import call_checks, schedules
from commlib.core.call_spec import COLLECTIVE
from commlib.core.schedules import VerificationError

MAPPED = {("all_reduce", "mapped_one_shot"), ("all_reduce", "mapped_two_shot"),
          ("all_reduce", "mapped_fused_two_shot"), ("all_gather", "mapped"),
          ("reduce_scatter", "mapped"), ("reduce_scatter", "mapped_fused"), ("all_to_all", "mapped")}


def registered(collective, algorithm, size, count):
    return [schedules.schedule(collective, algorithm, r, size, count) for r in range(size)]


def verify(collective, size, count, scheds, in_place=None):
    _C._verify_custom(COLLECTIVE[collective], size, count, scheds, 0, in_place)


def rejects(match, collective, size, count, scheds, in_place=None):
    with pytest.raises(VerificationError, match=match):
        verify(collective, size, count, scheds, in_place)


def drop(sched, step, op, peer, tag=None):
    ops = sched["steps"][step]
    keep = [o for o in ops if not (o["op"] == op and o["peer"] == peer and (tag is None or o["tag"] == tag))]
    assert len(keep) == len(ops) - 1, (op, peer, ops)
    sched["steps"][step] = keep


def test_mapped_algorithms_are_registered_one_sided_and_not_listed_for_communicators():
    found = {(c, a["name"]) for c in commlib.COLLECTIVES for a in schedules.algorithm_info(c)
             if "one_sided" in a["traits"]}
    assert found == MAPPED
    for c, a in MAPPED:
        assert a not in schedules.algorithms(c) and a in schedules.algorithms(c, one_sided=True)
        call_checks.check_algorithm(c, a)  # a known name; the device kernel path runs it
        with pytest.raises(ValueError, match=f"^algorithm: {c} algorithm '{a}' is one-sided .* not on host buffers"):
            call_checks.check_one_sided_on_host(c, a)
        with pytest.raises(ValueError, match=f"^algorithm: {c} algorithm '{a}' is one-sided .* not with compress="):
            call_checks.check_one_sided_on_host(c, a, compress="bf16")
    call_checks.check_one_sided_on_host("all_reduce", "ring")


def test_a_one_sided_schedule_reads_in_place_and_prints():
    s = schedules.schedule("all_gather", "mapped", rank=1, size=3, count=2)
    ops = [o["op"] for st in s["steps"] for o in st]
    assert ops.count("get") == 2 and ops.count("signal") == 4 and ops.count("wait") == 4
    assert "send" not in ops and "recv" not in ops and s["scratch_count"] == 0
    text = schedules.format_schedule(s, "all_gather", 1, 3, 2)
    assert "get(from 0, output[0:2] <- input[0:2])" in text and "wait(2, tag 0)" in text
    # The dict format round-trips: a schedule handed back is the schedule verified.
    verify("all_gather", 3, 2, registered("all_gather", "mapped", 3, 2))


def test_missing_ready_signal_is_a_read_after_write_hazard():
    # Rank 1 never tells rank 0 its buffers are in the call (the counts still balance).
    s = registered("all_gather", "mapped", 4, 3)
    drop(s[1], 0, "signal", 0)
    drop(s[0], 1, "wait", 1)
    rejects(r"rank 0 step 1 op \d+ get\(from 1, output\[3:6\] <- input\[0:3\]\) reads rank 1's input\[0\] unordered "
            r"with rank 1's use of its buffers before the call \(read-after-write hazard: .*signal/wait is missing",
            "all_gather", 4, 3, s)


def test_missing_release_signal_is_a_write_after_read_hazard_at_return():
    # Rank 3 never tells rank 0 it finished reading rank 0's input; rank 0 returns regardless.
    s = registered("all_gather", "mapped", 4, 3)
    drop(s[3], 1, "signal", 0)
    drop(s[0], 2, "wait", 3)
    rejects(r"rank 0 returns \(its caller may reuse rank 0's (input|output)\[\d+\]\) unordered with rank 3's read in its "
            r"step 1 \(write-after-read hazard at the end", "all_gather", 4, 3, s, in_place=False)


def test_overwriting_a_region_peers_still_read_is_rejected_in_place_only():
    # One-shot all_reduce: rank 0 sums into its output only after every peer's "done" signal,
    # because in place its output is the input the peers read. Moving those waits after the sum
    # races; out of place nobody reads the output, so the same schedule is correct.
    s = registered("all_reduce", "mapped_one_shot", 3, 4)
    first = next(i for i, st in enumerate(s[0]["steps"]) if any(o["op"] == "wait" and o["tag"] == 2 for o in st))
    waits = [o for o in s[0]["steps"][first] if o["op"] == "wait"]
    s[0]["steps"][first] = [o for o in s[0]["steps"][first] if o["op"] != "wait"]
    s[0]["steps"].append(waits)
    verify("all_reduce", 3, 4, s, in_place=False)
    rejects(r"rank 0's output\[0\] unordered with rank \d's (read|write) in its step \d+ \((write-after-read|read-after-write) "
            r"hazard", "all_reduce", 3, 4, s, in_place=True)


def test_a_put_racing_a_peers_read_is_rejected():
    s = registered("all_reduce", "mapped_one_shot", 3, 4)
    s[1]["steps"][1].append({"op": "put", "peer": 2, "dst": ("output", 0, 4), "src": ("input", 0, 4)})
    rejects(r"rank 1 step 1 op \d+ put\(to 2, output\[0:4\] <- input\[0:4\]\) writes rank 2's output\[0\] unordered with "
            r"rank \d's read in its step \d \(write-after-read hazard", "all_reduce", 3, 4, s, in_place=True)


def test_two_shot_gather_before_the_owners_result_is_rejected():
    s = registered("all_reduce", "mapped_two_shot", 4, 9)
    for x in s:  # the gather step loses its waits for kTagResult
        x["steps"][-2] = [o for o in x["steps"][-2] if o["op"] != "wait"]
        for st in x["steps"]:  # and the result signals go too, so the flags still balance
            st[:] = [o for o in st if not (o["op"] == "signal" and o["tag"] == 1)]
    rejects(r"hazard", "all_reduce", 4, 9, s)


def fused_schedule(coll, algo, rank, size, count, fused_op):
    """Rank ``rank``'s schedule of a fused one-sided algorithm and its fused op, checked to have the
    fused shape (one_sided.h's append_fused: ready to every peer; once every peer's ready came, the
    one ``fused_op``, then a signal to every peer; the wait for every peer's) and proven by the
    verifier at that size and count."""
    s = schedules.schedule(coll, algo, rank=rank, size=size, count=count)
    peers = size - 1
    ops = [[o["op"] for o in st] for st in s["steps"]]
    assert ops == [["signal"] * peers, ["wait"] * peers + [fused_op] + ["signal"] * peers, ["wait"] * peers], ops
    verify(coll, size, count, registered(coll, algo, size, count))
    return s, s["steps"][1][peers]


def test_the_fused_two_shot_reads_and_writes_every_rank_once_per_element():
    # rank r: ready to every peer; once every peer's ready came, one reduce_to_all of block r (every
    # rank's input read, the sum stored into every rank's output), then result to every peer; and
    # it returns once every peer's result came. The gather step and the get_reduce chain are gone.
    s, fused = fused_schedule("all_reduce", "mapped_fused_two_shot", 1, 4, 10, "reduce_to_all")
    assert fused["peer"] is None and fused["dst"] == ("output", 3, 3) and fused["src"] == ("input", 3, 3), fused
    text = schedules.format_schedule(s)
    assert "reduce_to_all(every rank's output[3:6] <- every rank's input[3:6])" in text, text


@pytest.mark.parametrize("in_place", [False, True])
def test_the_fused_two_shot_without_its_result_wait_is_rejected(in_place):
    # Rank 0 returns without waiting for rank 2's result: rank 2 may still read rank 0's input
    # block 2 or store into its output block 2 (the counts still balance: rank 2 stops signalling).
    s = registered("all_reduce", "mapped_fused_two_shot", 4, 9)
    drop(s[2], 1, "signal", 0, tag=1)
    drop(s[0], 2, "wait", 2, tag=1)
    rejects(r"rank 0 returns \(its caller may reuse rank 0's (input|output)\[[5-6]\]\) unordered with rank 2's "
            r"(read|write) in its step 1", "all_reduce", 4, 9, s, in_place=in_place)


def test_the_fused_two_shot_without_a_ready_signal_is_rejected():
    # Rank 3 never says its buffers are in the call: rank 1 reads its input block 1 (and stores into
    # its output block 1) unordered with rank 3's use of them before the call.
    s = registered("all_reduce", "mapped_fused_two_shot", 4, 9)
    drop(s[3], 0, "signal", 1)
    drop(s[1], 1, "wait", 3)
    rejects(r"rank 1 step 1 op \d+ reduce_to_all\(every rank's output\[3:5\] <- every rank's input\[3:5\]\) "
            r"(reads|writes) rank 3's (input|output)\[3\] unordered with rank 3's use of its buffers before the call",
            "all_reduce", 4, 9, s, in_place=False)


def test_the_fused_reduce_scatter_reads_every_rank_once_and_writes_only_its_output():
    # rank r: ready to every peer; once every peer's ready came, one reduce_from_all of block r (every
    # rank's input block r read, the sum stored into r's output only), then done to every peer; it
    # returns once every peer's done came.
    s, fused = fused_schedule("reduce_scatter", "mapped_fused", 2, 3, 4, "reduce_from_all")
    assert fused["peer"] is None and fused["dst"] == ("output", 0, 4) and fused["src"] == ("input", 8, 4), fused
    assert "reduce_from_all(output[0:4] <- every rank's input[8:12])" in schedules.format_schedule(s)


@pytest.mark.parametrize("in_place", [False, True])
def test_the_fused_reduce_scatter_without_its_done_wait_is_rejected(in_place):
    # Rank 0 returns without waiting for rank 1's done: rank 1 may still read rank 0's input block 1.
    s = registered("reduce_scatter", "mapped_fused", 3, 5)
    drop(s[1], 1, "signal", 0, tag=2)
    drop(s[0], 2, "wait", 1, tag=2)
    rejects(r"rank 0 returns \(its caller may reuse rank 0's input\[[5-9]\]\) unordered with rank 1's read in its step 1",
            "reduce_scatter", 3, 5, s, in_place=in_place)


def test_the_fused_reduce_scatter_without_a_ready_signal_is_rejected():
    # Rank 2 never says its input is in the call: rank 0 reads its block 0 unordered with rank 2's
    # use of its buffers before the call.
    s = registered("reduce_scatter", "mapped_fused", 3, 5)
    drop(s[2], 0, "signal", 0)
    drop(s[0], 1, "wait", 2)
    rejects(r"rank 0 step 1 op \d+ reduce_from_all\(output\[0:5\] <- every rank's input\[0:5\]\) reads rank 2's "
            r"input\[0\] unordered with rank 2's use of its buffers before the call", "reduce_scatter", 3, 5, s)


def test_a_reduce_to_all_over_its_own_source_in_part_is_rejected():
    s = registered("all_reduce", "mapped_fused_two_shot", 2, 4)
    fused = next(o for o in s[0]["steps"][1] if o["op"] == "reduce_to_all")
    fused["dst"] = ("output", 1, 2)
    rejects(r"reduce_to_all.*its source and destination overlap", "all_reduce", 2, 4, s, in_place=True)


def test_unbalanced_flags_and_hanging_waits_are_rejected():
    s = registered("all_gather", "mapped", 3, 2)
    s[2]["steps"][0].append({"op": "signal", "peer": 1, "tag": 0})
    rejects(r"rank 2 signals rank 1 \(tag 0\) 2 times but rank 1 waits 1 times", "all_gather", 3, 2, s)
    s = registered("all_gather", "mapped", 3, 2)
    s[2]["steps"][2].append({"op": "wait", "peer": 1, "tag": 5})
    rejects(r"deadlock: rank 2 stuck in step 2 waiting for 1 signal\(s\) from rank 1 \(tag 5; 0 posted", "all_gather", 3, 2, s)


@pytest.mark.parametrize("op, match", [
    ({"op": "signal", "peer": 1, "tag": 9}, r"signal\(1, tag 9\): tag 9 out of range \[0, 8\)"),
    ({"op": "wait", "peer": 0, "tag": 0}, r"bad peer 0"),
    ({"op": "put", "peer": 1, "dst": ("input", 0, 2), "src": ("output", 0, 2)}, r"writes rank 1's input buffer"),
    ({"op": "get", "peer": 1, "dst": ("output", 0, 2), "src": ("input", 1, 2)}, r"rank 1's input has 2 elements"),
    ({"op": "get", "peer": 1, "dst": ("output", 0, 2), "src": ("input", 0, 1)}, r"counts differ"),
    ({"op": "send", "peer": 1, "src": ("input", 0, 2)}, r"rank \d uses one-sided ops and rank 0 sends or receives"),
])
def test_malformed_one_sided_ops_are_rejected(op, match):
    s = registered("all_gather", "mapped", 2, 2)
    s[0]["steps"][-1].append(op)
    rejects(match, "all_gather", 2, 2, s)


def test_a_python_builder_cannot_register_one_sided_ops():
    def builder(rank, size, count, root):
        return [[{"op": "get", "peer": 1 - rank, "dst": ("output", 0, count), "src": ("input", 0, count)}]]

    schedules.register_algorithm("broadcast", "one_sided_probe", builder)
    try:
        with pytest.raises(ValueError, match=r"get is one-sided: an algorithm registered at run time runs on the host"):
            schedules.schedule("broadcast", "one_sided_probe", 0, 2, 4)
    finally:
        schedules.unregister_algorithm("broadcast", "one_sided_probe")


def test_a_one_sided_algorithm_cannot_run_a_hierarchical_phase():
    # Its regions would be rebased into the parent's buffers, which no peer mapped, beside messages.
    hosts = [0, 0, 1, 1]
    for inter, intra in (("mapped", ""), ("ring", "mapped")):
        what = "intra_algorithm" if intra else "inter_algorithm"
        with pytest.raises(ValueError, match=f"^{what}: all_gather algorithm 'mapped' is one-sided and cannot run a phase"):
            _C.schedule(COLLECTIVE["all_gather"], "hierarchical", 0, 4, 3, 0, _C.DType.float32, hosts, inter, 0, intra)


def test_auto_refuses_a_one_sided_override_or_tuning_row(monkeypatch):
    monkeypatch.setenv("COMMLIB_ALGO_ALL_REDUCE", "mapped_two_shot")
    with pytest.raises(ValueError, match="^COMMLIB_ALGO_ALL_REDUCE: all_reduce algorithm 'mapped_two_shot' is one-sided"):
        _C.choose_algorithm(_C.Collective.all_reduce, "auto", 1 << 20, 4)
    monkeypatch.delenv("COMMLIB_ALGO_ALL_REDUCE")
    with pytest.raises(ValueError, match="^tuning: all_reduce algorithm 'mapped_one_shot' is one-sided"):
        _C.set_tuning(_C.Collective.all_reduce, [(4, -1, "mapped_one_shot")])
    # Named explicitly it still resolves: the verifier and the simulator take it.
    assert _C.choose_algorithm(_C.Collective.all_reduce, "mapped_two_shot", 8, 4) == "mapped_two_shot"


def test_a_communicator_refuses_one_sided_algorithms_and_stays_usable():
    # Refused before anything is sent (by the C++ fast path's executor or the Python checks, as the
    # call goes), alike at any world size (one rank's schedule is a plain copy).
    import numpy as np
    from commlib.bootstrap.store import StoreServer, TCPStore

    server = StoreServer("127.0.0.1", 0)
    comm = commlib.init(rank=0, world_size=1, store=TCPStore("127.0.0.1", server.port), prefix="one_sided")
    try:
        x = np.ones(4, np.float32)
        with pytest.raises(ValueError, match="^algorithm: mapped_two_shot is one-sided"):
            comm.all_reduce(x, algorithm="mapped_two_shot")
        out = np.zeros(4, np.float32)
        with pytest.raises(ValueError, match="^algorithm: (all_gather algorithm 'mapped'|mapped) is one-sided"):
            comm.all_gather(x, out, algorithm="mapped")
        comm.all_reduce(x, algorithm="ring")
        assert (x == 1).all()
    finally:
        comm.close()
        server.close()


def test_a_one_shot_summing_in_another_order_on_one_rank_is_rejected():
    # Every rank of the one-shot sums in rank order 0, 1, 2; rank 1 adding rank 2's input before
    # its own would end with other bits than rank 0 (float addition is not associative).
    s = registered("all_reduce", "mapped_one_shot", 3, 4)
    own = {"op": "reduce", "peer": None, "dst": ("scratch", 0, 4), "src": ("input", 0, 4)}
    other = {"op": "reduce", "peer": None, "dst": ("scratch", 0, 4), "src": ("scratch", 4, 4)}
    assert own in s[1]["steps"][2] and s[1]["steps"][3] == [other]
    s[1]["steps"][2] = [other if o == own else o for o in s[1]["steps"][2]]
    s[1]["steps"][3] = [own]
    rejects(r"rank 1 output\[0\] was reduced in a different order than on rank 0", "all_reduce", 3, 4, s)
