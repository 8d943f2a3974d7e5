"""NCCL on the emulated device: the `nccl` link and algorithm="nccl" (csrc/stream/nccl_link.h),
run against the emulated NCCL (csrc/device/emulated/nccl_emulated.h, a test double of NCCL's API semantics:
grouping, stream order, in-order matching per pair, abort; not NCCL itself).

The collective matrix is a covering selection with the stream delay on: at world sizes 1, 2, 3
and 5, algorithm="nccl" runs every collective at every count (0, 1, size - 1, 13) and every
schedule family (commlib.algorithms) runs over the nccl link (COMMLIB_DEVICE_LINK=nccl) at one
count, rotating; dtypes, ops, roots and in/out of place rotate across the cases. Emulated hosts
(COMMLIB_HOST_ID) give the auto rule's mix: peer memory within a host, NCCL across. Outputs
every rank must hold identically are compared bitwise across ranks.
"""
import os
import sys

import pytest

import commlib
import commlib._C as _C

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_cases  # noqa: E402
import nccl_cases  # noqa: E402
from device_cases import cc  # noqa: E402

from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank  # noqa: E402

COLLECTIVES = ["all_reduce", "reduce_scatter", "reduce", "all_gather", "all_to_all", "broadcast",
               "gather", "scatter"]
ROOTED = ("reduce", "broadcast", "gather", "scatter")
# One emulated device per rank: the emulated NCCL, like NCCL, refuses two ranks on one device.
DELAY = {"COMMLIB_EMULATED_DELAY_US": "20", "COMMLIB_EMULATED_DEVICE": tuple(map(str, range(8)))}
NCCL_LINK = {**DELAY, "COMMLIB_DEVICE_LINK": "nccl"}
TWO_HOSTS = {**DELAY, "COMMLIB_HOST_ID": ("a", "a", "b", "b")}


def _ops(dtype):
    return cc.INT_OPS if dtype in cc.INTS else cc.FLOAT_OPS


def _case(coll, algo, count, k, P):
    dtype = cc.DTYPES[k % len(cc.DTYPES)]
    op = _ops(dtype)[k % len(_ops(dtype))] if coll in device_cases.REDUCING else "sum"
    if algo == "nccl" and op in ("band", "bor", "bxor"):
        op = "max"  # NCCL has no bitwise ops (refused: test_nccl_refuses_what_it_lacks)
    root = (0, P - 1, P // 2)[k % 3] if coll in ROOTED else 0
    return (coll, algo, dtype, op, count, root, k % 2 == 1)


def matrix_cases(P):
    counts = (0, 1, max(P - 1, 0), 13)
    cases, k = [], P
    for coll in COLLECTIVES:
        for count in counts:
            cases.append(_case(coll, "nccl", count, k, P))
            k += 1
        for a, algo in enumerate(commlib.algorithms(coll)):
            cases.append(_case(coll, algo, counts[(a + P) % 4], k, P))
            k += 1
    return cases


def big_cases(P):
    """Messages larger than the emulated NCCL's 4 x 64 KiB of buffering per pair, so a send
    completes only once the peer posts its receive: ungrouped sends and receives of a pairwise
    step would deadlock. algorithm="nccl" and the first schedule family of every collective."""
    n = 100_003  # prime, ~400 KB of float32
    return [_case(coll, algo, n, i, P)[:2] + ("float32", "sum", n, 0, False)
            for i, coll in enumerate(COLLECTIVES) for algo in ("nccl", commlib.algorithms(coll)[0])]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_nccl_link_and_algorithm_matrix(pool, size):
    p = pool(size, env=NCCL_LINK)
    if size > 1:  # every pair is on NCCL, and its communicator exists
        assert p.run(nccl_cases.links) == [(True, True)] * size
        assert p.run(nccl_cases.link_names) == [["nccl" if q != r else "" for q in range(size)] for r in range(size)]
    cases = matrix_cases(size) + (big_cases(size) if size == 3 else [])
    device_cases.check_results(p.run(device_cases.check_cases, cases, timeout=200))


@pytest.mark.timeout(120)
def test_point_to_point_over_the_nccl_link(pool):
    # device_p2p_cases' send/recv rings, fan-out/in batches and uneven all_to_all splits (counts 0
    # to several chunks), every pair on NCCL.
    import device_p2p_cases as p2p
    p = pool(3, env=NCCL_LINK)
    for case in (p2p.ring_shift, p2p.fan_out_and_in, p2p.all_to_all_uneven):
        assert p.run(case, timeout=100) == [[]] * 3, case.__name__


@pytest.mark.timeout(120)
def test_a_groups_messages_to_one_peer_move_in_order(pool):
    # rail_window's merged device list across hosts: an NCCL group of 128 messages to one peer. A
    # sweep of rank 0's group that holds a send back pauses (the peer frees slots), then the rest of
    # the sweep moves, then it pauses again (the peer reads): every sum stays exact, as NCCL matches
    # a pair's messages in order (before session 30 the emulated NCCL let a later send pass the held
    # one: a stale slot read, a different element each run of test_device_laned_plans.py).
    out = pool(4, env=TWO_HOSTS).run(nccl_cases.grouped_sends_in_order, 8, 200, timeout=100)
    assert out[0][0] == 1, out  # the pause happened (the group held a send back behind another)
    assert [right for _, right in out] == [True] * 4, out


@pytest.mark.timeout(240)
def test_ipc_within_hosts_nccl_across(pool):
    p = pool(4, env=TWO_HOSTS)
    # Ranks 0, 1 on host a and 2, 3 on host b: every engine carries some peers over NCCL.
    assert p.run(nccl_cases.links) == [(True, True)] * 4
    assert p.run(nccl_cases.link_names) == [["", "ipc", "nccl", "nccl"], ["ipc", "", "nccl", "nccl"],
                                            ["nccl", "nccl", "", "ipc"], ["nccl", "nccl", "ipc", ""]]
    # Forced nccl: every pair on NCCL, ranks of one host too (their control regions still mapped).
    assert p.run(nccl_cases.forced_links, "nccl") == [
        ([("nccl" if q != r else "") for q in range(4)], 1, True, True, True) for r in range(4)]
    cases = [_case(coll, algo, (13, 97)[i % 2], i, 4)
             for i, (coll, algo) in enumerate((c, a) for c in COLLECTIVES for a in commlib.algorithms(c))]
    device_cases.check_results(p.run(device_cases.check_cases, cases, timeout=200))


def test_ipc_only_by_default_on_one_host(pool):
    # One host, auto: no pair uses NCCL and no NCCL communicator is created.
    p = pool(2, env=DELAY)
    assert p.run(nccl_cases.links) == [(False, False)] * 2
    assert p.run(nccl_cases.link_names) == [["", "ipc"], ["ipc", ""]]
    # Forced ipc or nccl on one host: that link for the pair; NCCL's communicator only for nccl.
    assert p.run(nccl_cases.forced_links, "ipc") == [(["", "ipc"], 1, False, False, True),
                                                     (["ipc", ""], 1, False, False, True)]
    assert p.run(nccl_cases.forced_links, "nccl") == [(["", "nccl"], 1, True, True, True),
                                                      (["nccl", ""], 1, True, True, True)]
    for kind, msg in p.run(nccl_cases.disagreeing_link_settings, timeout=60):
        assert kind == "MismatchError" and "COMMLIB_DEVICE_LINK=nccl" in msg and "=auto" in msg, msg


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [2, 3])
def test_nccl_calls_after_the_first_run_from_cpp(pool, size):
    # The first algorithm="nccl" call makes NCCL's communicator on the Python route; later ones of
    # any shape run from the C++ entry (csrc/bindings/device_call_new_shape.cc, nccl_ready).
    for rank, (hits, new, error, right) in enumerate(pool(size, env=DELAY).run(nccl_cases.nccl_calls_run_from_cpp,
                                                                             timeout=90)):
        assert hits == [0, 1, 1, 1, None] and new == [0, 0, 1, 1], (rank, hits, new)
        assert error and error.startswith("op:") and "band" in error, (rank, error)
        assert right, rank


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", ["first", "later"])
def test_nccl_mismatch_raises_on_both_ranks(pool, scenario):
    for rank, (msg, took) in enumerate(pool(2, env=DELAY).run(nccl_cases.mismatch, scenario, timeout=60)):
        assert msg is not None and "wrong type" not in msg, (rank, msg)
        want = ("64", "65") if scenario == "first" else ("nccl", "ring")
        assert all(w in msg for w in want) and "rank 0" in msg and "rank 1" in msg, (rank, msg)
        assert took < 20, (rank, took)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("fn,env", [(nccl_cases.kill_during_nccl_algorithm, DELAY),
                                    (nccl_cases.kill_during_nccl_link, NCCL_LINK)], ids=["algorithm", "link"])
def test_killed_peer_raises_peer_error_and_releases_the_stream(fn, env):
    slow_victim = {**env, "COMMLIB_EMULATED_DELAY_US": ("20", "200000", "20")}
    results = run_killing_one_rank(3, 1, fn, env=slow_victim, timeout=60)
    assert_survivors_named_the_dead_rank(results, 1)
    for res in results:
        assert res is None or "not released" not in res[0], res


def test_no_thread_fd_or_device_memory_left(pool):
    for before, after in pool(3, env=NCCL_LINK).run(nccl_cases.resources):
        assert before == after, (before, after)


def test_nccl_refuses_what_it_lacks(pool):
    p = pool(2, env=DELAY)
    for msg in p.run(nccl_cases.host_buffers_refused):
        assert msg and "device buffers" in msg and "'nccl'" in msg, msg
    for msg in p.run(nccl_cases.band_refused):
        assert msg and "band" in msg and "NCCL" in msg, msg


def test_device_link_choice_per_pair():
    # The stream engine's choice (csrc/stream/device_link.h), for host maps and settings: auto is
    # ipc within a host and nccl across, ipc/nccl force every pair, ipc across hosts and unknown
    # settings are refused naming the variable. (rank's links, some pair of the world uses nccl)
    links = _C.device_links
    assert links([0, 0, 1], 0, "auto") == (["", "ipc", "nccl"], True)
    assert links([0, 0, 1], 2, "auto") == (["nccl", "nccl", ""], True)
    assert links([0, 0, 1, 1], 3, "") == (["nccl", "nccl", "ipc", ""], True)
    assert links([0, 0, 0], 1, "auto") == (["ipc", "", "ipc"], False)
    assert links([0, 0, 1], 1, " NCCL ") == (["nccl", "", "nccl"], True)
    assert links([0, 0], 0, "ipc") == (["", "ipc"], False)
    assert links([0, 1, 1], 1, "auto") == (["nccl", "", "ipc"], True)  # rank 1's pairs are not all ipc
    assert links([0, 0, 1, 1], 0, "auto")[1] and links([7], 0, "nccl") == ([""], False)
    for host_of, rank, setting in (([0, 1, 2], 2, "ipc"), ([0, 0, 1], 0, "ipc")):
        with pytest.raises(ValueError, match="COMMLIB_DEVICE_LINK.*another host"):
            links(host_of, rank, setting)
    with pytest.raises(ValueError, match="COMMLIB_DEVICE_LINK.*tcp"):
        links([0, 0], 0, "tcp")


class _Store:
    def __init__(self):
        self.d = {}

    def set(self, k, v):
        self.d[k] = v.encode() if isinstance(v, str) else bytes(v)

    def check(self, keys):
        return all(k in self.d for k in keys)

    def get(self, k):
        return self.d[k]


def _Comm(rank, store):
    """The communicator as the NCCL set-up sees it (the device route's public seam)."""
    from commlib.device.route_context import RouteContext
    return RouteContext(core=None, store=store, prefix="p", rank=rank, size=2, timeout=5.0)


class _Engine:
    def __init__(self, load_error=None):
        self.load_error, self.inited = load_error, None

    def nccl_load(self, candidates):
        if self.load_error:
            raise RuntimeError(self.load_error)

    def nccl_unique_id(self):
        return b"i" * 128

    def nccl_init(self, uid):
        self.inited = uid


def test_unique_id_rendezvous_checks_size_and_spreads_failures():
    from commlib.device import nccl_comm as device_nccl
    from commlib.errors import CommError
    store = _Store()
    # Rank 0 cannot load libnccl: it raises the loader's error, rank 1 hears at once (no timeout).
    with pytest.raises(RuntimeError, match="tried"):
        device_nccl._create(_Comm(0, store), _Engine("no libnccl could be loaded; tried: x.so"), "p")
    with pytest.raises(CommError, match="rank 0: RuntimeError: no libnccl could be loaded; tried: x.so"):
        device_nccl._create(_Comm(1, store), _Engine(), "p")
    # An id of the wrong size in the store is refused before NCCL reads it.
    store = _Store()
    store.set("q/id", b"x" * 127)
    engine = _Engine()
    with pytest.raises(CommError, match="expected 128 bytes, got 127"):
        device_nccl._create(_Comm(1, store), engine, "q")
    assert engine.inited is None
    # The exact size goes to ncclCommInitRank.
    store.set("q/id", b"y" * 128)
    device_nccl._create(_Comm(1, store), engine, "q")
    assert engine.inited == b"y" * 128
