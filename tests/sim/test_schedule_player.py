"""The verifier and the simulator play schedules with one rendezvous player
(csrc/schedule/player.h): a schedule that deadlocks is reported alike by both, naming the stuck
rank, its step, the message it waits for and where that peer is."""
import pytest

import commlib
import commlib._C as _C
from test_closed_forms import uniform


def receive_first(rank, size, count, root):
    """Both ranks receive before they send: with rendezvous messages neither ever sends."""
    peer = 1 - rank
    return {"steps": [[{"op": "recv", "peer": peer, "dst": ("output", 0, count)}],
                      [{"op": "send", "peer": peer, "src": ("input", 0, count)}]]}


def test_verifier_and_simulator_report_one_deadlock():
    commlib.register_algorithm("all_reduce", "receive_first", receive_first)
    try:
        report = r"deadlock: rank 0 stuck in step 0 waiting for receive from rank 1 \(which is in step 0\)"
        with pytest.raises(commlib.VerificationError, match=report):
            commlib.verify("all_reduce", "receive_first", 2, 4)
        with pytest.raises(RuntimeError, match="simulate: " + report):
            _C.simulate(_C.Collective.all_reduce, "receive_first", 4, 4, 0, uniform(2))
    finally:
        commlib.unregister_algorithm("all_reduce", "receive_first")


def paired(rank, size, count, root):
    """2-rank all_reduce of 8 elements: X = [0:2] and Y = [2:8] reduce-scattered then all-gathered,
    pipelined, so step 2 holds two sends to and two receives from the peer (Y's all-gather, 3
    elements, then X's reduce-scatter, 1; ir.h: matched in op order), a plain receive before a
    reducing one."""
    p = 1 - rank
    xs, ys = [(0, 1), (1, 1)], [(2, 3), (5, 3)]  # each segment's half owned by rank 0, 1

    def msg(kind, half):
        return {"op": kind, "peer": p, ("src" if kind == "send" else "dst"): ("output", *half)}
    return {"steps": [[{"op": "copy", "dst": ("output", 0, 8), "src": ("input", 0, 8)}],
                      [msg("send", ys[p]), msg("recv_reduce", ys[rank])],
                      [msg("send", ys[rank]), msg("send", xs[p]), msg("recv", ys[p]), msg("recv_reduce", xs[rank])],
                      [msg("send", xs[rank]), msg("recv", xs[p])]]}


def test_two_messages_a_pair_in_one_step_match_in_op_order():
    """The verifier proves the schedule and the simulator plays it: the step's shape keeps a pair's
    messages in op order (a receive and a reducing one as one order), so Y's 3 elements meet Y's
    receive and X's 1 X's, and both messages take time on the one link."""
    commlib.register_algorithm("all_reduce", "paired", paired)
    try:
        commlib.verify("all_reduce", "paired", 2, 8)
        out = _C.simulate(_C.Collective.all_reduce, "paired", 8, 4, 0, uniform(2))
        assert out["transfers"] == 8 and out["steps"] == 8 and out["time_s"] > 0
    finally:
        commlib.unregister_algorithm("all_reduce", "paired")
