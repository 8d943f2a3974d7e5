"""Row 10: `init()` failures (store timeout, wrong WORLD_SIZE on one rank).

Before: TimeoutError / ConnectionError that were not CommError and did not name the cause on the
other ranks. Now every rank raises RendezvousError (a CommError); a world-size disagreement is named
as such on every rank that takes part, within the timeout rather than after it.
"""
import time

import pytest

import commlib
from commlib.bootstrap.store import StoreServer, TCPStore
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
    # Rank 1 never publishes its host (commlib.bootstrap.hosts), the first thing every rank does.
    with pytest.raises(commlib.RendezvousError, match=r"rank 0 waited 0.5 s .* for rank 1 to publish its host"):
        _init(server, "nobody", 0, 2, timeout=0.5)


def test_unreachable_store_is_a_rendezvous_error():
    from commlib.bootstrap.ports import free_port
    port = free_port()  # nothing listens there
    with pytest.raises(commlib.RendezvousError, match=f"127.0.0.1:{port}"):
        commlib.init(rank=1, world_size=2, master_addr="127.0.0.1", master_port=port, timeout=0.3)
    assert issubclass(commlib.RendezvousError, commlib.CommError)


def test_failed_and_successful_rendezvous_leak_no_descriptors_or_threads(server):
    import gc
    import os
    import threading

    def fds():
        out = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                out[fd] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # the descriptor listdir itself used
                pass
        return out

    def snapshot():
        gc.collect()
        return len(fds()), threading.active_count()

    def settled(before=None, within=5.0):
        # The store server runs in this process: its handler threads close their side of a
        # connection when they see the client's EOF, a moment after the client closed (a CI run
        # once counted one descriptor too many for that reason). Wait (bounded) until the server
        # holds no connection and the counts stop moving, so the comparison sees leaks only.
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            now = snapshot()
            if server.connections == 0 and (before is None or now == before):
                break
            time.sleep(0.05)
        time.sleep(0.05)  # a handler thread that just closed its socket is finishing
        return snapshot()

    def job(r, prefix, sizes, timeout=5):
        store = TCPStore("127.0.0.1", server.port, timeout=timeout)
        try:  # the store is the caller's: init() and close() leave it open
            commlib.init(rank=r, world_size=sizes[r], store=store, prefix=prefix, timeout=timeout).close()
        finally:
            store.close()

    run_ranks(lambda r: job(r, "warm", (2, 2)), 2)  # first use loads what stays loaded
    before = settled()
    before_fds = fds()
    run_ranks(lambda r: job(r, "leak-ok", (2, 2)), 2)
    run_ranks(lambda r: job(r, "leak-bad", (2, 3)), 2)
    with pytest.raises(commlib.RendezvousError):
        job(0, "leak-alone", (2,), timeout=0.3)
    with pytest.raises(commlib.RendezvousError):  # init's own store connection, closed on failure
        commlib.init(rank=1, world_size=2, master_addr="127.0.0.1", master_port=server.port,
                     prefix="leak-owned", timeout=0.3)
    after = settled(before)
    extra = {fd: what for fd, what in fds().items() if before_fds.get(fd) != what}
    assert after == before, f"descriptors and threads {after} vs {before}; new descriptors: {extra}"
