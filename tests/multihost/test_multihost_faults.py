"""Failures across hosts: mismatched calls, a killed rank, a silent rank, and no leaked sockets or
threads after closing communicators that span hosts (emulated hosts, TCP over loopback)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "host"))

import error_cases  # noqa: E402
import multihost_cases as cases  # noqa: E402
from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank  # noqa: E402

LOOPBACK = {"COMMLIB_SOCKET_IFNAME": "lo"}


def env_for(hosts):
    return {**LOOPBACK, "COMMLIB_HOST_ID": hosts}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("scenario", ["collective", "count"])
def test_mismatch_across_hosts(pool, scenario):
    hosts = ("a", "b", "b")  # rank 0 alone: its peers reach it only over TCP
    for rank, (msg, took, later, names) in enumerate(pool(3, env=env_for(hosts)).run(
            error_cases.mismatch, scenario, timeout=90)):
        assert msg is not None and "wrong type" not in msg, f"rank {rank}: {msg}"
        assert all(n in msg for n in names), f"rank {rank}: message does not name both calls: {msg}"
        assert took < 20, f"rank {rank} took {took:.1f} s to detect the mismatch"
        assert later is not None and later < 1.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hosts,victim", [(("a", "a", "b", "b"), 2), (("a", "b", "c"), 0)], ids=["2x2", "1x3"])
def test_killed_rank_on_another_host(hosts, victim):
    results = run_killing_one_rank(len(hosts), victim, error_cases.kill_during_collective, env=env_for(hosts))
    assert_survivors_named_the_dead_rank(results, victim, within_s=30)
    if hosts.count(hosts[victim]) == 1:  # the victim was reached over TCP only: the link says why
        for rank, res in enumerate(results):
            if rank != victim:
                assert "connection lost" in res[0], f"rank {rank}: {res[0]}"


@pytest.mark.timeout(60)
def test_silent_rank_on_another_host_times_out(pool):
    res = pool(3, env=env_for(("a", "b", "c"))).run(error_cases.silent_peer, timeout=40)
    for rank in (0, 2):
        msg, took = res[rank]
        assert "rank 1" in msg and "all_reduce" in msg and "did not answer" in msg, msg
        assert 1.5 < took < 10, took
    msg, took = res[1]
    assert msg.startswith(("PeerError", "CommError")) and took < 1.0, (msg, took)


@pytest.mark.timeout(120)
def test_no_socket_or_thread_leaks(pool):
    for before, after in pool(4, env=env_for(("a", "a", "b", "b"))).run(cases.split_cycles, timeout=100):
        assert after == before, f"(fds, threads) before {before}, after {after}"
