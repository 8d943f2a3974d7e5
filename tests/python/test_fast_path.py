"""The C++ fast path for blocking calls on NumPy arrays (csrc/bindings/fast_call.cc): it must give
the general path's results, decline everything unusual (so the general path explains errors), and
actually be taken in the common case."""
import sys

import numpy as np
import pytest

import commlib
import commlib._C as _C
from commlib.bootstrap.store import StoreServer, TCPStore

import fast_path_cases as cases

CODES = {c: i for i, c in enumerate(_C.COLLECTIVES)}


@pytest.fixture(scope="module")
def comm1():
    s = StoreServer("127.0.0.1", 0)
    comm = commlib.init(rank=0, world_size=1, store=TCPStore("127.0.0.1", s.port), prefix="fast")
    yield comm
    comm.close()
    s.close()


def _fast(comm, coll, a, b=None, op="sum", algorithm="auto", root=0, async_op=False, scale=None):
    return _C.fast_collective(comm._addr, CODES[coll], a, b, op, algorithm, root, async_op, scale)


def test_declines_what_it_does_not_handle(comm1):
    x = np.ones(4, np.float32)
    torch = pytest.importorskip("torch")
    declined = [
        _fast(comm1, "all_reduce", x, async_op=True),                   # async: general path's Work
        _fast(comm1, "all_reduce", torch.ones(4, 2)[:, 0]),             # torch, not contiguous
        _fast(comm1, "all_reduce", x.view(cases.Sub)),                  # ndarray subclass
        _fast(comm1, "all_reduce", np.ones((4, 2), np.float32)[:, 0]),  # not contiguous
        _fast(comm1, "all_reduce", np.ones(4, np.complex64)),           # unsupported dtype
        _fast(comm1, "all_reduce", np.ones(4, np.float32)[::1].copy().view(">f4")),  # byte order
        _fast(comm1, "all_reduce", x, op="bogus"),
        _fast(comm1, "all_reduce", x, op="band"),                       # bitwise on floats
        _fast(comm1, "all_reduce", x, op="premul_sum"),                 # premul without scale
        _fast(comm1, "all_reduce", x, scale=2.0),                       # scale without premul
        _fast(comm1, "all_reduce", x, algorithm="bogus"),
        _fast(comm1, "all_reduce", x, np.ones(5, np.float32)),          # out of another size
        _fast(comm1, "all_reduce", x, np.ones(4, np.float64)),          # out of another dtype
        _fast(comm1, "broadcast", x, root=1),                           # root out of range
        _fast(comm1, "broadcast", x, root=True),                        # bool is not a rank
        _fast(comm1, "all_gather", x, np.ones(3, np.float32)),          # wrong output size
        _fast(comm1, "gather", x, None),                                # root without output
        _fast(comm1, "barrier", None, algorithm="bogus"),               # barrier's algorithm too
    ]
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    declined.append(_fast(comm1, "all_reduce", ro))
    assert all(d is NotImplemented for d in declined), declined


def test_general_path_still_explains_errors(comm1):
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="^op: unknown reduction 'bogus'"):
        comm1.all_reduce(x, op="bogus")
    with pytest.raises(ValueError, match="^algorithm: unknown all_reduce algorithm 'bogus'"):
        comm1.all_reduce(x, algorithm="bogus")
    with pytest.raises(ValueError, match="^algorithm: unknown barrier algorithm 'bogus'"):
        comm1.barrier(algorithm="bogus")
    with pytest.raises(ValueError, match="^out: has 5 elements"):
        comm1.all_reduce(x, out=np.ones(5, np.float32))
    with pytest.raises(ValueError, match="^root: 3 is out of range"):
        comm1.broadcast(x, root=3)
    with pytest.raises(ValueError, match="^output: required on the root rank"):
        comm1.gather(None, x)
    # A scale given as text is refused, not converted (float("2") would take it).
    with pytest.raises(TypeError, match="^scale: expected a number, got str '2'"):
        comm1.all_reduce(x, op="premul_sum", scale="2")
    with pytest.raises(TypeError, match="^scale: expected a number, got list"):
        comm1.all_reduce(x, op="premul_sum", scale=[2])
    assert x.tolist() == [1.0] * 4
    comm1.all_reduce(x, op="premul_sum", scale=np.float32(2))  # a NumPy scalar is a number
    assert x.tolist() == [2.0] * 4


def test_world_of_one_results(comm1):
    x = np.arange(5, dtype=np.int64)
    comm1.all_reduce(x, op="premul_sum", scale=3)
    assert x.tolist() == [0, 3, 6, 9, 12]
    out = np.zeros(5, np.int64)
    comm1.all_to_all(out, x)
    assert out.tolist() == x.tolist()


@pytest.mark.parametrize("size", [2, 3])
def test_fast_and_general_paths_agree(pool, size):
    p = pool(size)
    assert p.run(cases.fast_path_taken) == [[True] * 10] * size
    failures = [f for fails in p.run(cases.check_paths_agree, timeout=120) for f in fails]
    assert not failures, "\n".join(failures[:20])



def test_takes_algorithms_registered_at_run_time(comm1):
    # The fast path's table of algorithm names follows the registry: a Python-registered builder is
    # run by the fast path (not handed to the general path), and once removed it is declined.
    built = []

    def mirror(rank, size, count, root):  # world of one: copy input to output
        built.append(count)
        return {"steps": [[{"op": "copy", "dst": ("output", 0, count), "src": ("input", 0, count)}]]}

    x, out = np.arange(6, dtype=np.int32), np.zeros(6, np.int32)
    assert _fast(comm1, "all_reduce", x, out, algorithm="fast_path_mirror") is NotImplemented
    commlib.register_algorithm("all_reduce", "fast_path_mirror", mirror)
    try:
        assert _fast(comm1, "all_reduce", x, out, algorithm="fast_path_mirror") is None
        assert built == [6] and out.tolist() == list(range(6))
    finally:
        commlib.unregister_algorithm("all_reduce", "fast_path_mirror")
    assert _fast(comm1, "all_reduce", x, out, algorithm="fast_path_mirror") is NotImplemented


def test_a_name_made_at_run_time_is_known_by_its_value_and_never_outlives_its_registration(comm1):
    # A name that is not the interned string (joined at run time, as a list of algorithms or a config
    # file gives it) is compared by value once, then known by its address (call_names.cc): it must
    # still name what the registry says at each call, not what it named when first seen.
    ran = []

    def builder(tag):
        def build(rank, size, count, root):
            ran.append(tag)
            return {"steps": [[{"op": "copy", "dst": ("output", 0, count), "src": ("input", 0, count)}]]}
        return build

    x, out = np.arange(6, dtype=np.int32), np.zeros(6, np.int32)
    ring = "".join(["ri", "ng"])
    assert ring == "ring" and ring is not sys.intern("ring")
    for _ in range(3):
        assert _fast(comm1, "all_reduce", x, out, algorithm=ring) is None and out.tolist() == list(range(6))
    bogus = "".join(["bo", "gus"])
    assert [_fast(comm1, "all_reduce", x, out, algorithm=bogus) for _ in range(2)] == [NotImplemented] * 2
    name = "".join(["run_time_", "name"])
    commlib.register_algorithm("all_reduce", "run_time_name", builder("first"))
    try:
        assert _fast(comm1, "all_reduce", x, out, algorithm=name) is None
        assert _fast(comm1, "all_reduce", x, out, algorithm=name) is None
    finally:
        commlib.unregister_algorithm("all_reduce", "run_time_name")
    # another algorithm takes the removed one's index: the old name must not reach it
    commlib.register_algorithm("all_reduce", "run_time_other", builder("other"))
    try:
        assert _fast(comm1, "all_reduce", x, out, algorithm=name) is NotImplemented
        assert _fast(comm1, "all_reduce", x, out, algorithm=sys.intern("run_time_other")) is None
    finally:
        commlib.unregister_algorithm("all_reduce", "run_time_other")
    assert ran == ["first", "other"], ran  # (a builder runs once per call shape: the plan is cached)
    assert _fast(comm1, "all_reduce", x, out, algorithm=ring) is None  # the same object, the registry changed


def test_refuses_a_one_sided_algorithm_at_one_rank_too(comm1):
    # The host executor runs no one-sided schedule. One rank's schedule holds no operation at all, so
    # the refusal reads the algorithm's registered trait (kept in the call's plan), as every rank does.
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="^algorithm: mapped_two_shot is one-sided .* host executor does not run"):
        _fast(comm1, "all_reduce", x, algorithm="mapped_two_shot")
    comm1.all_reduce(x)  # refused before anything ran: the communicator goes on
    assert x.tolist() == [1.0] * 4


def test_numpy_arrays_are_read_from_the_array_itself(comm1):
    """The entry reads a NumPy array's own fields (csrc/bindings/numpy_view.cc), checked once against
    the buffer protocol: every dtype the core moves, any C-contiguous shape, is taken with the right
    count; what the buffer protocol would refuse or read otherwise is declined (above) or read as it."""
    before = _C.fast_path_counts()
    for dt in (np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.int64, np.longlong):
        x = np.arange(12, dtype=dt).reshape(3, 4)
        assert _fast(comm1, "all_reduce", x) is None
        assert np.array_equal(x, np.arange(12, dtype=dt).reshape(3, 4))
        out = np.zeros(12 * comm1.size, dt)
        assert _fast(comm1, "all_gather", x, out) is None  # the count is the whole array's
        assert np.array_equal(out, np.arange(12, dtype=dt))
    offers, declined = (b - a for a, b in zip(before, _C.fast_path_counts()))
    assert offers == 16 and declined == 0, (offers, declined)
    assert _C.numpy_reader_agrees()
    for x in (np.ones(4, np.bool_), np.ones(4, np.uint16), np.ones((4, 2), np.float32, order="F"),
              np.ones(8, np.float32).reshape(2, 4).T, np.ones(4, np.dtype("<f4").newbyteorder(">"))):
        assert _fast(comm1, "all_reduce", x) is NotImplemented, x.dtype
