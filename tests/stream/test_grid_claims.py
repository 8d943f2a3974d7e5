"""Two communicators on one GPU in different processes (issue #38, item 4): the emulated device's
resident blocks are shared by every process using it (COMMLIB_EMULATED_RESIDENT_BLOCKS=10 here,
csrc/device/emulated/emulated_residency.h), and the kernel path claims its grid in the device-wide
budget (csrc/stream/grid_claims.h). Rank side in grid_claims_cases.py.

* two communicators of 2 ranks, four processes on one device, kernel-path all_reduces at once in
  a loop: without the budget each rank sizes its grid to half the device (4 blocks of 5), 16
  blocks want 10 places, and spinning blocks of one communicator keep the other's from ever
  running (the calls fail by the timeout); with it the first communicator to set up gets 4 blocks
  per rank and the second the 2 left, 1 per rank, and every call completes. The claims and
  releases are counted, and no ledger is left in /dev/shm;
* a device whose budget has no block per rank left (another job holds 9 of 10): the kernel path
  refuses with an error that names the device and the claims, auto takes the copy path; after the
  other job releases, the kernel path runs;
* a claimant killed without releasing: the next set-up reclaims its blocks;
* no ledger to be had (a directory at its path): the kernel path refuses, naming it;
* halves of a communicator beside its live engine (the same processes): 2 blocks per rank each
  (without the rule that a process runs one engine at a time, the second half had none left);
* the cap on one communicator's claim (COMMLIB_DEVICE_GRID_PERCENT): two jobs capped at 40 % of
  the device each get 2 blocks per rank, whichever sets up first (uncapped: 4 and 1), both on the
  kernel path, results right; a cap that leaves a rank no block is refused naming the setting, on
  the kernel path and in auto alike, as are ranks that disagree on it;
* a communicator on two devices refused on the second (another job holds all of it): the blocks
  the first granted go back at set-up, not at close (auto runs on the copy path meanwhile);
* ranks that are MPS clients (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, which the emulated device
  enforces per process): the grid sized to the share, or refused naming it."""
import os
import sys
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grid_claims_cases as cases  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402

CAPACITY = 10
# A machine of its own (COMMLIB_EMULATED_MACHINE): a concurrent run of these tests elsewhere on this
# host is another machine, not two jobs on one device.
ENV = dict(DELAY_ENV, COMMLIB_EMULATED_RESIDENT_BLOCKS=str(CAPACITY), COMMLIB_TIMEOUT="30",
           COMMLIB_EMULATED_MACHINE=f"claims{uuid.uuid4().hex[:12]}")


@pytest.mark.timeout(400)
def test_two_jobs_on_one_device_claim_disjoint_grids_and_do_not_deadlock(pool):
    out = pool(4, env=ENV).run(cases.two_jobs, 30, timeout=360)
    for ok, grant, path, error, counted, left in out:
        assert error is None and ok, out
        assert path == "kernel", out
        assert counted == {"claims": 1, "releases": 1, "refused": 0, "reclaimed": 0}, out
        assert left == [], out
    grants = sorted({out[0][1], out[2][1]})
    assert out[0][1] == out[1][1] and out[2][1] == out[3][1], out  # a communicator's ranks alike
    assert grants == [1, 4], out  # 4 + 4 for the first, the 2 left for the second: 10 in all


@pytest.mark.timeout(240)
def test_no_block_left_per_rank_names_the_claims_and_a_release_frees_them(pool):
    out = pool(2, env=ENV).run(cases.refused_then_released, CAPACITY, timeout=200)
    for rank, (refusal, auto, after, counted, left) in enumerate(out):
        assert isinstance(refusal, str) and "COMMLIB_DEVICE_PATH=kernel" in refusal, refusal
        assert "do not fit beside the other communicators" in refusal and "9 of them claimed by 1" in refusal, refusal
        assert auto[0] == "copy" and auto[2] is False, auto
        assert after == ("kernel", 4, True), after
        # kernel's refused claim, auto's, the one after the release, each released when its engine
        # went (rank 0 also made and released the other job's raw claim: its process's counters)
        mine = 3 + (rank == 0)
        assert counted == {"claims": mine, "releases": mine, "refused": 2, "reclaimed": 0}, counted
        assert left == [], left


@pytest.mark.timeout(240)
def test_a_dead_claimants_blocks_are_reclaimed(pool):
    out = pool(2, env=ENV).run(cases.dead_claimant_reclaimed, CAPACITY, timeout=200)
    assert out[0][0] == CAPACITY, out  # the claimant held the whole device
    for got, setup, counted, left in out:
        assert setup == ("kernel", 4, True), out
        assert (counted["claims"], counted["releases"], counted["refused"]) == (1, 1, 0), out
        assert left == [], out
    assert sum(c["reclaimed"] for _, _, c, _ in out) == 1, out  # the first claim after the death


@pytest.mark.timeout(240)
def test_a_device_without_a_ledger_refuses_the_kernel_path_naming_it(pool):
    for refusal, left in pool(2, env=ENV).run(cases.no_ledger, timeout=200):
        assert isinstance(refusal, str) and "grid budget of emulated:" in refusal and "cannot be kept" in refusal, refusal
        assert "cannot open /dev/shm/commlib-grid-" in refusal, refusal
        assert left == [], left


@pytest.mark.timeout(240)
def test_a_subgroup_beside_its_parents_engine_takes_the_parents_grant(pool):
    out = pool(4, env=ENV).run(cases.subgroups_beside_their_parent, 10, timeout=200)
    assert out == [(True, 2, 2, "kernel", "kernel")] * 4, out


@pytest.mark.timeout(400)
def test_two_capped_jobs_share_the_device_on_the_kernel_path(pool):
    out = pool(4, env=ENV).run(cases.capped_jobs, 30, 40, timeout=360)
    for ok, grant, path, error, entries, left in out:
        assert error is None and ok, out
        assert (grant, path) == (2, "kernel"), out  # 40 % of 10 = 4 blocks for 2 ranks, for each job
        assert entries == [(2, 2, 2), (2, 2, 2)], out  # (blocks per rank, ranks, holders): 8 of 10 claimed
        assert left == [], out


@pytest.mark.timeout(240)
def test_a_cap_that_leaves_a_rank_no_block_is_refused_naming_the_setting(pool):
    for rank, (kernel, auto, mismatch, left) in enumerate(pool(2, env=ENV).run(cases.cap_refusals, timeout=200)):
        for refusal in (kernel, auto):  # auto does not hide it behind the copy path
            assert isinstance(refusal, str), refusal
            assert refusal.startswith("COMMLIB_DEVICE_GRID_PERCENT=10 caps this communicator at 1 of the 10 "
                                      "resident block(s) of emulated:"), refusal
            assert "less than one block for each of its 2 rank(s)" in refusal and "at least 20" in refusal, refusal
        assert mismatch == "COMMLIB_DEVICE_GRID_PERCENT: rank 0 uses 50, rank 1 51; every rank must use the same", \
            mismatch
        assert left == [], left


@pytest.mark.timeout(240)
def test_a_refusal_on_one_device_releases_the_claims_on_the_others(pool):
    out = pool(2, env=ENV).run(cases.refused_on_one_device_releases_the_others, CAPACITY, "auto", timeout=200)
    for setup, first, second, left in out:
        assert setup[0] == "copy" and setup[2] is False, out  # auto: the copy path, the kernel path unusable
        assert first == [], out  # its grant (4 per rank) went back at set-up, the engine still open
        assert second == [(0, 1, 2), (CAPACITY, 1, 1)], out  # the refusal held by both ranks; the other job
        assert left == [], out
    for refusal, first, second, left in pool(2, env=ENV).run(
            cases.refused_on_one_device_releases_the_others, CAPACITY, "kernel", timeout=200):
        assert isinstance(refusal, str) and "COMMLIB_DEVICE_PATH=kernel" in refusal, refusal
        assert f"{CAPACITY} of them claimed by 1 other communicator(s)" in refusal, refusal
        assert first == [] and left == [], (first, left)


@pytest.mark.timeout(240)
def test_an_mps_share_sizes_the_grid_or_refuses_naming_it(pool):
    """Issue #38 item 4's MPS limit: each rank an MPS client at 20 % of the device's 10 blocks (the
    emulated device holds each process's blocks to 2, as MPS would): the grid is 2 blocks per rank,
    not the 4 a launch would take, and split-item calls complete (a grid of 4 leaves 2 blocks of
    each rank waiting behind the spinning ones: the timeout). At 5 %, no block for a process:
    refused, naming the MPS setting."""
    for setup, client, left in pool(2, env=ENV).run(cases.mps_share, 20, 72, timeout=200):
        assert (setup, client, left) == (("kernel", 2, True), 2, []), (setup, client, left)
    for refusal, client, left in pool(2, env=ENV).run(cases.mps_share, 5, 73, timeout=200):
        assert isinstance(refusal, str) and "0 for its process (its MPS share: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)" \
            in refusal, refusal
        assert client == 0 and left == [], (client, left)


@pytest.mark.gpu
@pytest.mark.timeout(150)
def test_two_capped_jobs_share_a_gpus_kernel_path(pool):
    """The same on GPU 0 (scripts/gpu_check.sh's gpu step): the device-wide ledger keyed by the GPU's
    UUID, two jobs of 2 ranks at 50 % each, both on the kernel path with equal grants (the second
    finds as much left as the first took), results right, no deadlock."""
    pytest.importorskip("torch")
    out = pool(4, env={"COMMLIB_TIMEOUT": "30"}).run(cases.capped_jobs_cuda, 10, timeout=120)
    for ok, grant, path, error in out:
        assert error is None and ok and path == "kernel", out
    assert out[0][1] == out[1][1] == out[2][1] == out[3][1] > 0, out
