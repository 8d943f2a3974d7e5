"""commlib.bootstrap.fdpass errors on a multi-host job name the global rank, its host and the host's leader
(a local rank alone does not say which process failed)."""
import os

import pytest

from commlib.errors import RendezvousError
from commlib.bootstrap.fdpass import FdServer, receive_fd


def test_unreachable_leader_names_global_ranks_and_host():
    with pytest.raises(RendezvousError) as e:
        receive_fd("commlib-nobody-listens-here", os.getpid(), 1, 0.05, rank=5, leader=4, host="node-b")
    assert str(e.value).startswith("rank 5 on host node-b: cannot reach the descriptor socket of rank 4 (the host's leader)"), str(e.value)


def test_wrong_process_names_global_ranks_and_host():
    r, w = os.pipe()
    server = FdServer(r, 2)
    try:
        with pytest.raises(RendezvousError) as e:
            receive_fd(server.name, os.getpid() + 1, 1, 1.0, rank=7, leader=6, host="node-c")
        msg = str(e.value)
        assert msg.startswith("rank 7 on host node-c:") and "not to rank 6 (the host's leader)" in msg, msg
    finally:
        server.close()
        os.close(r)
        os.close(w)


def test_single_host_keeps_local_numbering():
    with pytest.raises(RendezvousError) as e:
        receive_fd("commlib-nobody-listens-here", os.getpid(), 2, 0.05)
    assert str(e.value).startswith("rank 2: cannot reach the descriptor socket of rank 0"), str(e.value)
