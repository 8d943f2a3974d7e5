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
