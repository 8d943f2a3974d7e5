"""Row 10: `init()` failures (store timeout, wrong WORLD_SIZE on one rank).

Before: TimeoutError / ConnectionError that were not CommError and did not name the cause on the
other ranks. Now every rank raises RendezvousError (a CommError); a world-size disagreement is named
as such on every rank that takes part, within the timeout rather than after it.
"""
import time

import pytest

import commlib
from commlib.store import StoreServer, TCPStore
from hardening_util import run_ranks


@pytest.fixture
def server():
    s = StoreServer("127.0.0.1", 0)
    yield s
    s.close()


def _init(server, prefix, rank, size, timeout=10.0):
    return commlib.init(rank=rank, world_size=size, store=TCPStore("127.0.0.1", server.port, timeout=timeout),
                        prefix=prefix, timeout=timeout)


@pytest.mark.parametrize("sizes", [(2, 3), (3, 2, 2)], ids=["rank1-says-3", "rank0-says-3"])
def test_wrong_world_size_is_named_on_every_rank(server, sizes):
    t = time.monotonic()
    out = run_ranks(lambda r: _init(server, f"ws{len(sizes)}", r, sizes[r]), len(sizes))
    for r, res in enumerate(out):
        if r >= sizes[r]:  # its own arguments are inconsistent: refused before the store is used
            assert isinstance(res, ValueError) and "out of range" in str(res), (r, res)
            continue
        assert isinstance(res, commlib.RendezvousError), (r, res)
        assert "world size mismatch" in str(res), (r, res)
    assert time.monotonic() - t < 8  # reported, not waited out (timeout is 10 s)


def test_missing_rank_times_out_with_rendezvous_error(server):
    t = time.monotonic()
    with pytest.raises(commlib.RendezvousError, match="rank 1 waited 0.5 s .* for rank 0 to publish"):
        _init(server, "alone", 1, 2, timeout=0.5)
    assert time.monotonic() - t < 5


def test_rank0_reports_a_rank_that_never_comes(server):
    # Rank 1 never publishes its host (commlib.bootstrap), the first thing every rank does.
    with pytest.raises(commlib.RendezvousError, match=r"rank 0 waited 0.5 s .* for rank 1 to publish its host"):
        _init(server, "nobody", 0, 2, timeout=0.5)


def test_unreachable_store_is_a_rendezvous_error():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(commlib.RendezvousError, match=f"127.0.0.1:{port}"):
        commlib.init(rank=1, world_size=2, master_addr="127.0.0.1", master_port=port, timeout=0.3)
    assert issubclass(commlib.RendezvousError, commlib.CommError)


def test_failed_and_successful_rendezvous_leak_no_descriptors_or_threads(server):
    import gc
    import os
    import threading

    def snapshot():
        gc.collect()
        return len(os.listdir("/proc/self/fd")), threading.active_count()

    def job(r, prefix, sizes):
        comm = _init(server, prefix, r, sizes[r], timeout=5)
        comm.close()

    run_ranks(lambda r: job(r, "warm", (2, 2)), 2)  # first use loads what stays loaded
    before = snapshot()
    run_ranks(lambda r: job(r, "leak-ok", (2, 2)), 2)
    run_ranks(lambda r: job(r, "leak-bad", (2, 3)), 2)
    with pytest.raises(commlib.RendezvousError):
        _init(server, "leak-alone", 0, 2, timeout=0.3)
    assert snapshot() == before
