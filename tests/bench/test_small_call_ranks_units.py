"""bench/small_call_ranks.py's timed call (make_call) and /proc counters, without starting ranks:
each library's call gets the buffers, size and algorithm asked for."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import small_call_ranks as scr  # noqa: E402


class Recorder:
    """Stands for a communicator: records each method call's arguments."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *a, **k: self.calls.append((name, a, k))


class FakeBackend:
    def __init__(self, size):
        self.size, self.comm = size, Recorder()


@pytest.mark.parametrize("size", [3, 4])
def test_commlib_calls_get_the_size_and_algorithm(size):
    b = FakeBackend(size)
    for coll in ("all_to_all", "broadcast", "barrier"):
        scr.make_call(b, "commlib", coll, 16 << 20, "direct")()
    (a2a, (out, inp, algo), _), (bc, (buf, root, algo2), _), (bar, args, kw) = b.comm.calls
    assert (a2a, bc, bar) == ("all_to_all", "broadcast", "barrier")
    # all_to_all: the whole send buffer is the size (the sweep's meaning), in whole blocks
    assert inp.nbytes <= 16 << 20 and inp.size % size == 0 and inp.size > (16 << 20) // 4 - size
    assert out.shape == inp.shape and out is not inp and algo == "direct"
    assert buf.nbytes == 16 << 20 and root == 0 and algo2 == "direct"
    # positional, in barrier's order (async_op first): a keyword would copy a dict at every call,
    # about 0.13 us, which Open MPI's call (no arguments) does not pay
    assert args == (False, "direct") and kw == {}


def test_mpi_calls_and_small_sizes():
    b = FakeBackend(4)
    scr.make_call(b, "mpi", "all_to_all", 8, "ignored")()
    scr.make_call(b, "mpi", "broadcast", 8, "ignored")()
    (name, (s, r), _), (name2, (buf, root), _) = b.comm.calls
    assert (name, name2) == ("Alltoall", "Bcast")
    assert s.size == 4 and r.size == 4  # at least one element per rank
    assert buf.size == 2 and root == 0
    scr.make_call(b, "mpi", "barrier", 8, "x")()
    assert b.comm.calls[-1][0] == "Barrier"


def test_schedstat_counts_time_on_a_core():
    run0, wait0 = scr.schedstat()
    x = np.ones(1 << 20)
    for _ in range(50):
        x = x * 1.0000001  # some work on the core
    run1, wait1 = scr.schedstat()
    assert run1 > run0 and wait1 >= wait0


def test_in_place_all_to_all_passes_one_buffer():
    b = FakeBackend(4)
    scr.make_call(b, "commlib", "all_to_all", 1 << 20, "direct", in_place=True)()
    (name, (out, inp, algo), _), = b.comm.calls
    assert name == "all_to_all" and out is inp and algo == "direct"
    b.MPI = type("MPI", (), {"IN_PLACE": object()})
    scr.make_call(b, "mpi", "all_to_all", 1 << 20, "x", in_place=True)()
    (name, (send, recv), _) = b.comm.calls[-1]
    assert name == "Alltoall" and send is b.MPI.IN_PLACE and recv.nbytes == 1 << 20
