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
