"""Single-process tests of the rendezvous store, init()'s environment handling and logging."""
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import commlib
from commlib.bootstrap.store import StoreServer, TCPStore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def server():
    s = StoreServer("127.0.0.1", 0)
    yield s
    s.close()


def test_store_set_get_add_and_blocking_get(server):
    a, b = TCPStore("127.0.0.1", server.port), TCPStore("127.0.0.1", server.port)
    a.set("k", b"v")
    assert b.get("k") == b"v"
    assert a.add("n", 2) == 2 and b.add("n", 3) == 5
    threading.Timer(0.2, lambda: a.set("late", "x")).start()
    t = time.monotonic()
    assert b.get("late") == b"x" and time.monotonic() - t >= 0.15
    assert b.check(["k", "late"]) and not b.check(["missing"])


def test_store_get_times_out(server):
    c = TCPStore("127.0.0.1", server.port, timeout=0.3)
    with pytest.raises(commlib.RendezvousError, match="missing"):
        c.get("missing")


def test_init_world_of_one_from_each_launcher_env(monkeypatch, server):
    for env in ({"RANK": "0", "WORLD_SIZE": "1"},
                {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"},
                {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}):
        for k in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
                  "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        comm = commlib.init(store=TCPStore("127.0.0.1", server.port), prefix=str(sorted(env)))
        assert (comm.rank, comm.size) == (0, 1)
        x = np.arange(5, dtype=np.int32)
        out = np.zeros(5, np.int32)
        comm.all_reduce(x, out=out)
        assert (out == x).all()
        comm.close()


def test_init_validates_arguments(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
              "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="rank/world_size"):
        commlib.init()
    with pytest.raises(ValueError, match="rank"):
        commlib.init(rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size"):
        commlib.init(rank=0, world_size=0)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK"):
        commlib.init(world_size=1)
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("COMMLIB_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="COMMLIB_TIMEOUT"):
        commlib.init(rank=0, world_size=1)
    monkeypatch.setenv("COMMLIB_TIMEOUT", "5")
    monkeypatch.setenv("COMMLIB_DEBUG", "LOUD")
    with pytest.raises(ValueError, match="COMMLIB_DEBUG"):
        commlib.init(rank=0, world_size=1)


def test_debug_logging_reports_init_and_auto_choice():
    code = ("import commlib, numpy as np\n"
            "c = commlib.init(rank=0, world_size=1, master_port=0)\n"
            "c.all_reduce(np.ones(4, np.float32)); c.close()\n")
    env = dict(os.environ, COMMLIB_DEBUG="TRACE", PYTHONPATH=ROOT)
    err = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60).stderr
    assert "commlib INFO" in err and "transport shm" in err, err
    assert "auto picked" in err and "all_reduce" in err, err
    assert "commlib TRACE" in err and "all_reduce #1" in err, err


def test_world_of_one_every_collective():
    s = StoreServer("127.0.0.1", 0)
    comm = commlib.init(rank=0, world_size=1, store=TCPStore("127.0.0.1", s.port))
    x = np.arange(6, dtype=np.float64)
    out = np.zeros(6)
    comm.all_gather(out, x)
    assert (out == x).all()
    out[:] = 0
    comm.reduce_scatter(out, x, op="max")
    assert (out == x).all()
    comm.all_to_all(out, x)
    assert (out == x).all()
    comm.broadcast(x)
    comm.barrier()
    comm.all_reduce(x, op="avg")
    assert (x == np.arange(6)).all()
    comm.close()
    s.close()


@pytest.mark.parametrize("var", ["COMMLIB_STREAM_BYTES", "COMMLIB_COPY_CHUNK_BYTES", "COMMLIB_SHM_SLOTS"])
def test_bad_executor_settings_name_the_variable(monkeypatch, var):
    monkeypatch.setenv(var, "lots")
    s = StoreServer("127.0.0.1", 0)
    try:
        with pytest.raises(ValueError, match=f"^{var}"):
            commlib.init(rank=0, world_size=1, store=TCPStore("127.0.0.1", s.port), prefix="badenv")
    finally:
        s.close()


def test_a_peer_reported_dead_is_a_peer_error_on_every_rank(server):
    """A set-up wait (stream engine, NCCL) that reads another rank's failure report: a dead peer
    stays a PeerError naming the collective and the dead rank, whichever rank saw it first (the
    flake of test_close_does_not_wait_for_a_killed_peer: a rank that read rank 0's report raised
    CommError instead); any other failure stays a CommError with the report in it."""
    from commlib.bootstrap.wait import report, reported_failure, wait_for_key
    store = TCPStore("127.0.0.1", server.port)
    dead = commlib.PeerError("all_reduce: stream engine set-up: rank 0 waits for rank 1's first call on device "
                             "buffers, but rank 1 is gone")
    store.set("seen/error", report(0, dead))

    def other(why):
        return commlib.CommError(f"set-up failed: {why}")

    def wait(key):
        return wait_for_key(store, key, time.monotonic() + 5, error_key=f"{key.split('/')[0]}/error",
                            on_error=lambda why: reported_failure(why, 2, other), on_timeout=lambda: AssertionError("timeout"))

    with pytest.raises(commlib.PeerError) as e:
        wait("seen/1")
    assert str(e.value).startswith("all_reduce: stream engine set-up") and "rank 1 is gone" in str(e.value)
    assert "reported to rank 2 by rank 0" in str(e.value)
    store.set("bad/error", report(3, ValueError("COMMLIB_DEVICE_PATH: ranks differ")))
    with pytest.raises(commlib.CommError) as e:
        wait("bad/1")
    assert type(e.value) is commlib.CommError and "rank 3: ValueError: COMMLIB_DEVICE_PATH" in str(e.value)
    # A report that does not follow the format is never taken for a dead peer.
    store.set("odd/error", "PeerError: rank 1 is gone")
    with pytest.raises(commlib.CommError) as e:
        wait("odd/1")
    assert type(e.value) is commlib.CommError
