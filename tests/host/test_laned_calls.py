"""The laned schedules (rail_window, rail_lanes, rail_ring, rail_split: schedule/lanes.h) on the host
executor, which runs their lanes in flight (docs/DESIGN.md "Laned calls"): shared memory inside an emulated host, TCP
between hosts (COMMLIB_HOST_ID per rank), one pool of rank processes per world size.

- The matrix: world sizes 1-5 and 8, every dtype, op and placement in a pairwise covering, awkward
  counts (0, 1, P - 1, 13, primes, 3 to 256 lanes, ~1M at 4 ranks), exact for integers and within
  the matrix's tolerances for floats, bitwise equal on every rank and bitwise equal to the same
  schedule run in list order. The lanes apply on 2 hosts of 2 and of 4 (rail_halving pairs
  power-of-two hosts of equal power-of-two sizes); at 1, 2, 3 and 5 ranks the algorithms are one lane
  (list order), which the test checks too. Also under single-copy reads (COMMLIB_CMA=1, small shm
  slots: messages go by rendezvous, parked ones read early).
- Overlap: rank 0's sends of lane 0 held (a test seam, host/lane_hold.h) while every rank finishes
  its other lanes (rail_lanes, rail_ring's channels, rail_split's channels and hierarchical part: all
  of them; rail_window: those its window lets go). Run in list order (the executor before issue #39)
  no step of another lane finishes while lane 0's first is held: checked by hand by running the laned
  path with every step in one lane's order (sessions 26 and 27).
- Channels in lanes (session 27): rail_ring's all_reduce, all_gather and reduce_scatter and
  rail_split at the same world sizes and host maps, in the same pools, exact and equal to list order.
- A rank killed inside a laned call: the others raise PeerError naming it and the call; ranks in
  different laned calls raise MismatchError naming both.
"""
import os

import pytest

import collective_cases
import laned_cases as cases
from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank

HOSTS = {1: ("a",), 2: ("a", "b"), 3: ("a", "a", "b"), 4: ("a", "a", "b", "b"), 5: ("a", "a", "a", "b", "b"),
         8: ("a", "b") * 4}
LANED_AT = (4, 8)  # the world sizes whose host maps pair (rail_halving's hosts)


def env_for(size, **extra):
    return {"COMMLIB_SOCKET_IFNAME": "lo", "COMMLIB_HOST_ID": HOSTS[size], "COMMLIB_HIER_SEGMENT": str(cases.SEGMENT),
            **extra}


def _exact_and_alike(results):
    """Every rank's (failures, digests, ...): no wrong result, and every case's bytes equal on all ranks."""
    failures = [f for fails, *_ in results for f in fails]
    assert not failures, f"{len(failures)} wrong result(s):\n" + "\n".join(failures[:20])
    by_case = {}
    for _, digests, *_ in results:
        for case, digest in digests:
            by_case.setdefault(case, set()).add(digest)
    differing = [case for case, ds in by_case.items() if len(ds) > 1]
    assert not differing, f"ranks differ bitwise in {len(differing)} case(s), e.g. {differing[:3]}"


def _check(results, size):
    _exact_and_alike(results)
    lanes = results[0][2]
    ahead = sum(res[3] for res in results)  # steps finished ahead of list order, all ranks
    parked = sum(res[4] for res in results)  # bytes that came before their step ran
    if size in LANED_AT:  # the counts past 13 run laned: 3, 15, 256 (and 256 at ~1M) lanes
        assert [lanes[c] for c in sorted(lanes) if c > 13] == [3, 15, 256] + ([256] if size == 4 else []), lanes
        assert ahead > 0 and parked > 0, (ahead, parked)  # (~270000 steps, ~3 MB at 8 ranks: session 26)
    else:  # one lane: step by step, as before
        assert set(lanes.values()) == {1}, lanes
        assert ahead == 0 and parked == 0, (ahead, parked)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
def test_laned_all_reduce_matrix(pool, size):
    results = pool(size, env=env_for(size)).run(cases.check_laned, timeout=540)
    _check(results, size)


# Channel lanes (session 27): rail_ring's channel count on each world size's host map (rail_ring.cc:
# L on equal hosts of even L, else 2, 1 with at most two ranks); rail_split adds hierarchical's lane.
RING_LANES = {1: 1, 2: 1, 3: 2, 4: 2, 5: 2, 8: 4}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
def test_channel_lanes_matrix(pool, size):
    """rail_ring (all_reduce, all_gather, reduce_scatter) and rail_split with each channel in a lane:
    exact, bitwise equal on every rank and to the same schedule run in list order (the pools of the
    matrix above: no new processes)."""
    results = pool(size, env=env_for(size)).run(cases.check_channels, timeout=540)
    _exact_and_alike(results)
    C = RING_LANES[size]
    want = {f"{c} rail_ring": [C] for c in ("all_reduce", "all_gather", "reduce_scatter")}
    want["all_reduce rail_split"] = [C + 1]
    assert results[0][2] == want, results[0][2]
    ahead = sum(res[3] for res in results)  # steps finished ahead of list order, all ranks
    if size >= 3:
        assert ahead > 0, ahead


@pytest.mark.timeout(300)
def test_laned_all_reduce_with_single_copy_reads(pool):
    """COMMLIB_CMA=1 with 4 KiB slots: inside each host large messages go by rendezvous (the receiver
    reads the sender's buffer); a laned call reads a parked one when it parks it, so the pair's
    acknowledgements keep the channel's order. The matrix, then ~1M elements in 4 lanes (~0.5 MiB
    messages inside a host, single-copy), some of them parked (counted)."""
    p = pool(4, env=env_for(4, COMMLIB_CMA="1", COMMLIB_SHM_SLOT_BYTES="4096"))
    assert all(p.run(collective_cases.direct_reads_enabled))
    _check(p.run(cases.check_laned, timeout=200), 4)
    for eager in (False, True):  # parked when needed (the default), every early chunk parked
        results = p.run(cases.laned_single_copy, eager=eager, timeout=200)
        failures = [f for fails, _, _ in results for f in fails]
        assert not failures, "\n".join(failures)
        assert all(sends > 0 for _, sends, _ in results), results
    # Eager: 14-19 parked single-copy messages a rank in 3 rounds (session 26; by default 1-4).
    assert sum(reads for _, _, reads in results) > 0, results


@pytest.mark.timeout(120)
def test_laned_all_reduce_over_stuttering_links(pool):
    """The toy transport's stuttering links inside each host (TCP between them): sends and receives
    stop part way through messages of several lanes to one peer, and results stay exact."""
    failures = [f for fails in pool(4, env=env_for(4)).run(cases.laned_over_stuttering_links, timeout=100) for f in fails]
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm", ["rail_lanes", "rail_window", "rail_ring", "rail_split"])
def test_other_lanes_finish_while_one_is_held(pool, tmp_path, algorithm):
    held = str(tmp_path / "held")
    results = pool(4, env=env_for(4)).run(cases.overlap_while_held, algorithm, held, f"held-{algorithm}", timeout=100)
    for rank, (others, while_held, after, exact) in enumerate(results):
        assert exact, (rank, algorithm)
        assert others > 0, (rank, others)
        if algorithm == "rail_lanes":
            # No window: every step of lane 1 finished while lane 0 was held, and only those ran ahead.
            assert while_held == others and after == others, (rank, others, while_held, after)
        elif algorithm in ("rail_ring", "rail_split"):
            # The channels' lanes (2 rings; rail_split: and hierarchical's) share nothing with lane 0.
            # Listed round by round, a step of them is ahead only while a lane-0 step listed before
            # it waits: on rank 0 (its first lane-0 step is held) every one of them; elsewhere those
            # past where lane 0's ring stalled, some at least.
            if rank == 0:
                assert while_held == others and after == others, (rank, others, while_held, after)
            else:
                assert 0 < while_held <= others, (rank, others, while_held, after)
        else:
            # A window of one segment's steps: some steps of other lanes, not all, ran ahead.
            assert 0 < while_held <= others, (rank, others, while_held, after)
    assert not os.path.exists(held)


@pytest.mark.timeout(120)
def test_mismatched_laned_calls_raise_naming_both(pool):
    """Ranks in different laned calls: the chunks' descriptors differ, every rank raises
    MismatchError naming both algorithms, soon, not after the timeout."""
    for rank, (msg, took) in enumerate(pool(4, env=env_for(4)).run(cases.mismatched_laned_calls, timeout=60)):
        assert msg.startswith("MismatchError") and "rail_lanes" in msg and "rail_window" in msg, (rank, msg)
        assert took < 15, (rank, took)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm", ["rail_lanes", "rail_window"])
def test_killed_rank_in_a_laned_call(algorithm):
    victim = 3
    before = set(os.listdir("/dev/shm"))
    results = run_killing_one_rank(4, victim, cases.kill_in_laned_call, env=env_for(4), timeout=90, args=(algorithm,))
    assert_survivors_named_the_dead_rank(results, victim, within_s=30)
    leaked = [f for f in set(os.listdir("/dev/shm")) - before if "commlib" in f]
    assert not leaked, f"left in /dev/shm: {leaked}"


@pytest.mark.timeout(240)
def test_auto_runs_rail_windows_intra_window_within_it(pool):
    """Session 32's intra window (ir.h Schedule::intra_window E: a step inside the host also waits for
    the E-th such step before it) as auto picks it on a real communicator: 8 ranks in 2 emulated hosts
    of 4 under COMMLIB_TOPOLOGY=dgx-h100, 16 MiB of int32, the model's rail_window shape with E 3
    (intra_window_cases.py). The call is exact on every rank, bitwise equal to the same schedule run in
    list order, ran laned (steps ahead of list order), and no rank ever had more than E of its steps
    inside the host in flight (Executor::intra_in_flight_max), but more than one: the window bounds
    the overlap, it does not serialise it. The same call again allocates nothing in commlib's C++."""
    import intra_window_cases

    env = {"COMMLIB_SOCKET_IFNAME": "lo", "COMMLIB_HOST_ID": ("a",) * 4 + ("b",) * 4, "COMMLIB_TOPOLOGY": "dgx-h100"}
    results = pool(8, env=env).run(intra_window_cases.run, timeout=200)
    resolution = results[0][0]
    assert resolution["algorithm"] == "rail_window" and resolution["E"] == 3, resolution
    for rank, (res, chose, exact, listed, ahead, in_flight, allocated) in enumerate(results):
        assert res == resolution and chose == "rail_window", (rank, res, chose)
        assert exact and listed, (rank, exact, listed)
        assert ahead > 0, (rank, ahead)
        assert 1 < in_flight <= resolution["E"], (rank, in_flight)
        # the window's gates are rebuilt at every laned call into kept capacity (schedule/lanes.cc):
        # a steady call allocates nothing (session 35; a list per call before)
        assert allocated == 0, (rank, allocated)
