"""Device calls across hosts, on emulated hosts (COMMLIB_HOST_ID per rank: host peers talk TCP,
device peers on other hosts take the nccl link, the emulated NCCL). An engine maps the control
region and inbox of the peers on its host only; a peer on another host gets the call descriptors
over NCCL (csrc/stream/remote_descriptors.*), and its liveness and host calls over the TCP control
plane. Every collective x a covering set of algorithms (algorithm="nccl" too) at 2 and 3 hosts,
mismatches and a killed rank on another host (rank-side code: device_multihost_cases.py)."""
import os
import sys

import pytest

import commlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_cases  # noqa: E402
import device_mixing_cases  # noqa: E402
import device_multihost_cases as cases  # noqa: E402
import device_p2p_cases  # noqa: E402
import nccl_cases  # noqa: E402
from device_cases import cc  # noqa: E402
import error_cases  # noqa: E402  (tests/host: on sys.path through device_cases)

from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank  # noqa: E402

# One emulated device per rank: the emulated NCCL, like NCCL, refuses two ranks on one device.
DELAY = {"COMMLIB_EMULATED_DELAY_US": "20", "COMMLIB_EMULATED_DEVICE": tuple(map(str, range(8)))}
TWO_HOSTS = {**DELAY, "COMMLIB_HOST_ID": ("a", "a", "b")}
THREE_HOSTS = {**DELAY, "COMMLIB_HOST_ID": ("a", "b", "c")}
COLLECTIVES = ["all_reduce", "reduce_scatter", "reduce", "all_gather", "all_to_all", "broadcast",
               "gather", "scatter"]
ROOTED = ("reduce", "broadcast", "gather", "scatter")


def _case(coll, algo, k, P):
    dtype = cc.DTYPES[k % len(cc.DTYPES)]
    ops = cc.INT_OPS if dtype in cc.INTS else cc.FLOAT_OPS
    op = ops[k % len(ops)] if coll in device_cases.REDUCING else "sum"
    if algo == "nccl" and op in ("band", "bor", "bxor"):
        op = "max"  # NCCL has none
    root = (0, P - 1, 1)[k % 3] if coll in ROOTED else 0
    count = (0, 1, 13, 97)[k % 4]
    return (coll, algo, dtype, op, count, root, k % 2 == 1)


def matrix(P, offset):
    """Every collective x every algorithm (auto and nccl included), counts, dtypes, ops, roots and
    placement rotating; ``offset`` shifts the rotation between the two topologies."""
    algos = lambda c: ["auto", "nccl"] + list(commlib.algorithms(c))  # noqa: E731
    pairs = [(c, a) for c in COLLECTIVES for a in algos(c)]
    return [_case(c, a, i + offset, P) for i, (c, a) in enumerate(pairs)]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("hosts,env,mapped", [(2, TWO_HOSTS, [(1, True), (1, True), (0, True)]),
                                              (3, THREE_HOSTS, [(0, True)] * 3)], ids=["2hosts", "3hosts"])
def test_device_collectives_across_hosts(pool, hosts, env, mapped):
    p = pool(3, env=env)
    assert p.run(cases.reach) == mapped  # nothing of a rank on another host is mapped
    device_cases.check_results(p.run(device_cases.check_cases, matrix(3, hosts), timeout=180))


@pytest.mark.timeout(120)
def test_point_to_point_across_hosts(pool):
    p = pool(3, env=TWO_HOSTS)
    for case in (device_p2p_cases.ring_shift, device_p2p_cases.all_to_all_uneven):
        assert p.run(case, timeout=100) == [[]] * 3, case.__name__
    p3 = pool(3, env=THREE_HOSTS)  # 0 -> 1 across hosts
    got = p3.run(device_p2p_cases.mismatched_pair, timeout=60)
    assert got[1][0] == "MismatchError" and "10" in got[1][1] and "11" in got[1][1], got
    # A host send against a device receive across hosts: the receiver, waiting for the descriptor
    # over NCCL, finds the host message of that number on its TCP link. (The other direction is
    # found on one host only: a device message to another host is not visible before its receive.)
    # 20 s: the healthy rank 2 closes without waiting out the 30 s closing barrier for its failed
    # peers (they say they closed their imports, failed or not).
    for rank, (kind, msg, took) in enumerate(p3.run(device_p2p_cases.host_against_device, True, timeout=20)[:2]):
        assert kind == "MismatchError" and "on device buffers" in msg and "rank 0" in msg, (rank, msg)
        assert took < 5, (rank, took)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", ["collective", "count", "root"])
def test_mismatch_across_hosts_raises_on_every_rank(pool, scenario):
    res = pool(3, env=THREE_HOSTS).run(error_cases.mismatch, scenario, "device", timeout=60)
    for rank, (msg, took, later, names) in enumerate(res):
        assert msg is not None and "wrong type" not in msg, (rank, msg)
        assert all(n in msg for n in names), (rank, msg)
        assert took < 20 and later is not None and later < 1.0, (rank, took, later)


@pytest.mark.timeout(120)
def test_nccl_against_ring_and_host_against_device_across_hosts(pool):
    # Ranks 0 and 1 on different hosts: algorithm="nccl" against "ring", and a host call against
    # a device call of the same number: MismatchError on both, naming both calls.
    p = pool(3, env=THREE_HOSTS)
    for rank, (msg, took) in enumerate(p.run(nccl_cases.mismatch, "later", timeout=60)[:2]):
        assert msg and "wrong type" not in msg and "nccl" in msg and "ring" in msg, (rank, msg)
        assert took < 20, (rank, took)
    for after_setup in (False, True):
        res = p.run(device_mixing_cases.host_versus_device, after_setup, timeout=60)
        for rank, (got, later) in enumerate(res[:2]):
            assert got[0] == "MismatchError" and "on device buffers" in got[1], (rank, got)
            assert got[2] < 10 and later[0] and later[2] < 1.0, (rank, got, later)


def test_ipc_link_across_hosts_is_refused(pool):
    p = pool(3, env=TWO_HOSTS)
    for msg in p.run(cases.ipc_across_hosts_refused, timeout=60):
        assert msg and "COMMLIB_DEVICE_LINK" in msg and "another host" in msg, msg
    # auto: ipc within host a, nccl across; forced nccl: every pair, the pair on host a still
    # mapped (its descriptors go through the control regions, its data over NCCL).
    assert p.run(nccl_cases.link_names) == [["", "ipc", "nccl"], ["ipc", "", "nccl"], ["nccl", "nccl", ""]]
    assert p.run(nccl_cases.forced_links, "nccl", timeout=60) == [
        (["", "nccl", "nccl"], 1, True, True, True), (["nccl", "", "nccl"], 1, True, True, True),
        (["nccl", "nccl", ""], 0, True, True, True)]


@pytest.mark.timeout(120)
def test_killed_rank_on_another_host_raises_peer_error():
    results = run_killing_one_rank(3, 1, error_cases.kill_during_collective, env=THREE_HOSTS, timeout=60,
                                   args=("device",))
    assert_survivors_named_the_dead_rank(results, 1, within_s=20)


def test_no_thread_fd_or_device_memory_left_across_hosts(pool):
    # Engines with peers on other hosts (descriptor staging, NCCL) leave nothing behind once closed.
    for before, after in pool(3, env=THREE_HOSTS).run(nccl_cases.resources, timeout=60):
        assert before == after, (before, after)


# The cost model decides auto (COMMLIB_TOPOLOGY), all_reduce forced by its override.
MODEL_AND_OVERRIDE = {**TWO_HOSTS, "COMMLIB_TOPOLOGY": "dgx-h100", "COMMLIB_ALGO_ALL_REDUCE": "ring"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env", [TWO_HOSTS, THREE_HOSTS, MODEL_AND_OVERRIDE], ids=["2hosts", "3hosts", "model+override"])
def test_host_and_device_resolve_auto_alike(pool, env):
    # One lowering (csrc/plan/plan_cache.h): the device resolves auto from the host map, the
    # overrides and the cost model, as the host does, so a call picks one algorithm whichever
    # buffers it is on.
    per_rank = pool(3, env=env).run(cases.host_and_device_choices, timeout=40)
    for rank, rows in enumerate(per_rank):
        differ = [r for r in rows if not r[2] == r[3] == r[5][0]]
        assert not differ, (rank, differ)
    if env is not THREE_HOSTS:  # (one rank per host: no host has local peers, the map changes nothing)
        # The host map matters for these shapes: a resolution without it (the size policy on one
        # host) picks differently for some, so a device path that ignored it would fail above.
        assert any(r[2] != r[4] for r in per_rank[0]), per_rank[0]
    if env is MODEL_AND_OVERRIDE:  # the model decided every call the override leaves to auto
        assert all(r[2] == "ring" for r in per_rank[0] if r[0] == "all_reduce"), per_rank[0]
        assert all(r[5][1] == "model" for r in per_rank[0] if r[0] != "all_reduce"), per_rank[0]
