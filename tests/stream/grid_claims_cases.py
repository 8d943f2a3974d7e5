"""Rank side of test_grid_claims.py (apart from the test module so that the ranks import neither
pytest nor the test modules): two communicators whose ranks are four processes on one emulated
device, and the device-wide grid budget's refusal, release and reclaim (csrc/stream/grid_claims.h)."""
import os
import signal
import subprocess
import sys

import numpy as np

import commlib._C as _C
import commlib.emulated as emu
from commlib.settings import overridden
from kernel_path_cases import KERNEL_SETTINGS, with_settings
from occupancy_cases import SPLIT_COUNT, _engine, on_device

DEVICE = 70  # every rank of every pool here (its own COMMLIB_EMULATED_MACHINE keeps other runs apart)
OTHER_JOB = 0x0fee1  # the communicator key of the stand-in for another job's engine


def ledgers_left():
    """The /dev/shm ledgers of the device that exist now (its grid budget's, its resident blocks')."""
    names = [emu.grid_claims(DEVICE)["ledger"], emu.residency(DEVICE)[0]]
    return [n for n in names if _C.shared_ledger_exists(n)]


def counts():
    c = emu.grid_claims(DEVICE)
    return {k: c[k] for k in ("claims", "releases", "refused", "reclaimed")}


def delta(before, after):
    return {k: after[k] - before[k] for k in after}


def two_jobs(comm, iterations):
    """Ranks 0 and 1 form one communicator, 2 and 3 another (two jobs on one GPU); every rank on
    the same emulated device; each runs `iterations` kernel-path all_reduces (split items: every
    block of the grid) at once with the other. Returns (every result right, the grant, the path,
    the error if one was raised, this process's claim counts over the run, ledgers left after
    every rank closed)."""
    before = counts()
    with on_device(DEVICE), overridden(KERNEL_SETTINGS):
        sub = comm.split(comm.rank // 2, timeout=30)
        ok, grant, path, error = True, None, None, None
        try:
            for i in range(iterations):
                x = emu.from_numpy(np.full(SPLIT_COUNT, sub.rank + 1 + i, np.float32))
                sub.all_reduce(x)
                want = sum(r + 1 + i for r in range(sub.size))
                ok = ok and bool((x.numpy() == want).all())
            grant, path = _engine(sub).kernel_grid_budget(), _engine(sub).last_path()
        except Exception as e:  # noqa: BLE001 - the test shows what a hang turned into
            ok, error = False, f"{type(e).__name__}: {e}"
        finally:
            try:
                sub.close()
            except Exception as e:  # noqa: BLE001
                error = error or f"close: {type(e).__name__}: {e}"
    comm.barrier()
    return ok, grant, path, error, delta(before, counts()), ledgers_left()


def _setup(sub):
    """The sub-communicator's first call: (path, grant, usable) or the error's message."""
    try:
        x = emu.from_numpy(np.full(SPLIT_COUNT, sub.rank + 1, np.float32))
        sub.all_reduce(x)
        assert (x.numpy() == sub.size * (sub.size + 1) / 2).all()
    except ValueError as e:
        return str(e)
    e = _engine(sub)
    return e.last_path(), e.kernel_grid_budget(), e.kernel_usable()


def refused_then_released(comm, capacity):
    """Rank 0 holds 9 of the device's 10 blocks for another job (a raw claim); this pool's two
    ranks then ask for 4 each: COMMLIB_DEVICE_PATH=kernel refuses (the message), auto takes the
    copy path; once the other job releases, the kernel path runs with 4 blocks per rank. Returns
    (refusal, auto's outcome, after the release, claim counts, ledgers left)."""
    before = counts()
    with on_device(DEVICE):
        other = _C.GridClaims()
        if comm.rank == 0:
            assert other.claim(_C.physical_id(emu.device(DEVICE)), capacity, OTHER_JOB, capacity - 1, [os.getpid()]) \
                == capacity - 1
        comm.barrier()
        refusal = with_settings(comm, KERNEL_SETTINGS, _setup)
        auto = with_settings(comm, dict(KERNEL_SETTINGS, COMMLIB_DEVICE_PATH="auto"), _setup)
        other.release()
        comm.barrier()
        after = with_settings(comm, KERNEL_SETTINGS, _setup)
    comm.barrier()
    return refusal, auto, after, delta(before, counts()), ledgers_left()


CLAIMANT = """
import os, sys, time
import commlib._C as _C
import commlib.emulated as emu
g = _C.GridClaims()
print(g.claim(_C.physical_id(emu.device(int(sys.argv[1]))), int(sys.argv[2]), int(sys.argv[3]),
              int(sys.argv[2]), [os.getpid()]), flush=True)
time.sleep(600)
"""


def dead_claimant_reclaimed(comm, capacity):
    """Another process claims every block of the device and is killed (SIGKILL: no release); the
    pool's set-up then finds the claim of a dead process, reclaims it and gets 4 blocks per rank.
    Returns (the claimant's grant, the set-up's outcome, claim counts, ledgers left)."""
    before = counts()
    got = None
    if comm.rank == 0:
        child = subprocess.Popen([sys.executable, "-c", CLAIMANT, str(DEVICE), str(capacity), str(OTHER_JOB + 1)],
                                 stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        try:
            got = int(child.stdout.readline())
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
    comm.barrier()
    with on_device(DEVICE):
        setup = with_settings(comm, KERNEL_SETTINGS, _setup)
    comm.barrier()
    return got, setup, delta(before, counts()), ledgers_left()


def no_ledger(comm):
    """A directory where the device's ledger would be (/dev/shm unusable for it): the kernel path
    refuses, naming the ledger, rather than run without the budget. Returns (the refusal, ledgers left)."""
    path = "/dev/shm/" + emu.grid_claims(DEVICE)["ledger"]  # (reads the ledger where it exists: before the mkdir)
    comm.barrier()
    if comm.rank == 0:
        os.mkdir(path)
    comm.barrier()
    try:
        with on_device(DEVICE):
            refusal = with_settings(comm, KERNEL_SETTINGS, _setup)
    finally:
        try:
            comm.barrier()
        finally:  # never left behind, whatever the set-up did
            if comm.rank == 0:
                os.rmdir(path)
    comm.barrier()
    return refusal, ledgers_left()


def subgroups_beside_their_parent(comm, iterations):
    """All four ranks' communicator (2 blocks per rank of 10) keeps its engine while its halves
    (ranks 0-1, 2-3: each its own communicator, the same processes) set up theirs: each half's
    processes run one engine's kernel at a time, so a half may take the parent's 2 per rank though
    the parent and the first half left fewer than that. Calls alternate between the parent and
    the half. Returns (every result right, the parent's grant, the half's, both paths)."""
    with on_device(DEVICE), overridden(KERNEL_SETTINGS):
        parent = comm.split(0, timeout=30)
        half = None
        try:
            ok = True
            for i in range(iterations):
                for c in (parent, half) if half is not None else (parent,):
                    x = emu.from_numpy(np.full(SPLIT_COUNT, c.rank + 1 + i, np.float32))
                    c.all_reduce(x)
                    ok = ok and bool((x.numpy() == sum(r + 1 + i for r in range(c.size))).all())
                if half is None:
                    half = parent.split(parent.rank // 2, timeout=30)
            return (ok, _engine(parent).kernel_grid_budget(), _engine(half).kernel_grid_budget(),
                    _engine(parent).last_path(), _engine(half).last_path())
        finally:
            if half is not None:
                half.close()
            parent.close()


def capped_jobs(comm, iterations, percent):
    """two_jobs with COMMLIB_DEVICE_GRID_PERCENT=`percent` on every rank: each communicator claims
    at most that share of the device for its two ranks together, so the second to set up finds as
    much left as the first took (not the remainder). Returns (every result right, the grant, the
    path, the error if one was raised, the ledger's entries (blocks per rank, ranks, holders) while
    both jobs hold theirs, ledgers left after every rank closed)."""
    with on_device(DEVICE), overridden(dict(KERNEL_SETTINGS, COMMLIB_DEVICE_GRID_PERCENT=str(percent))):
        sub = comm.split(comm.rank // 2, timeout=30)
        ok, grant, path, error, entries = True, None, None, None, None
        try:
            for i in range(iterations):
                x = emu.from_numpy(np.full(SPLIT_COUNT, sub.rank + 1 + i, np.float32))
                sub.all_reduce(x)
                ok = ok and bool((x.numpy() == sum(r + 1 + i for r in range(sub.size))).all())
            grant, path = _engine(sub).kernel_grid_budget(), _engine(sub).last_path()
        except Exception as e:  # noqa: BLE001 - the test shows what a hang turned into
            ok, error = False, f"{type(e).__name__}: {e}"
        finally:
            comm.barrier()  # both jobs set up (or failed) and still holding their claims
            entries = sorted(tuple(e[1:]) for e in emu.grid_claims(DEVICE)["entries"])
            comm.barrier()
            sub.close()
    comm.barrier()
    return ok, grant, path, error, entries, ledgers_left()


def cap_refusals(comm):
    """COMMLIB_DEVICE_GRID_PERCENT=10 on a device of 10 blocks shared by this pool's two ranks: 1
    block for the communicator, less than one per rank: refused on the kernel path and in auto alike
    (a setting to change, not a machine's limit), naming the setting; then ranks that disagree on
    the setting are refused naming it too. Returns (kernel's message, auto's, the mismatch's, ledgers
    left)."""
    with on_device(DEVICE):
        kernel = with_settings(comm, dict(KERNEL_SETTINGS, COMMLIB_DEVICE_GRID_PERCENT="10"), _setup)
        auto = with_settings(comm, dict(KERNEL_SETTINGS, COMMLIB_DEVICE_PATH="auto", COMMLIB_DEVICE_GRID_PERCENT="10"),
                             _setup)
        mismatch = with_settings(comm, dict(KERNEL_SETTINGS, COMMLIB_DEVICE_GRID_PERCENT=str(50 + comm.rank)), _setup)
    comm.barrier()
    return kernel, auto, mismatch, ledgers_left()


def refused_on_one_device_releases_the_others(comm, capacity, path):
    """A communicator whose two ranks are on two emulated devices (DEVICE and DEVICE + 1: one host
    with two GPUs), another job holding every block of the second: the first device grants its
    claim, the second refuses. With COMMLIB_DEVICE_PATH=`path` (auto: the copy path; kernel: the
    error), the first device's blocks go back at once, not when the engine closes. Returns (the
    set-up's outcome, the first device's entries after the set-up (before close), the second's,
    ledgers of both left at the end)."""
    first, second = DEVICE, DEVICE + 1
    other = _C.GridClaims()
    if comm.rank == 0:
        assert other.claim(_C.physical_id(emu.device(second)), capacity, OTHER_JOB, capacity, [os.getpid()]) == capacity
    comm.barrier()
    with on_device(first if comm.rank == 0 else second), overridden(dict(KERNEL_SETTINGS, COMMLIB_DEVICE_PATH=path)):
        sub = comm.split(0, timeout=30)
        try:
            setup = _setup(sub)
            comm.barrier()  # both ranks past their set-up, the engine (auto) still open
            held = [sorted(tuple(e[1:]) for e in emu.grid_claims(d)["entries"]) for d in (first, second)]
            comm.barrier()
        finally:
            sub.close()
    comm.barrier()
    if comm.rank == 0:
        other.release()
    comm.barrier()
    left = [n for d in (first, second) for n in (emu.grid_claims(d)["ledger"], emu.residency(d)[0])
            if _C.shared_ledger_exists(n)]
    return setup, held[0], held[1], left


def mps_share(comm, percent, index):
    """Each rank a process under CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=`percent` (an MPS client, as on
    a GPU: the emulated device `index`, made fresh with it, holds this process's blocks to that
    share of its 10) on one device with the pool's other rank: the grid is sized to the share, or
    refused naming it. Returns (the set-up's outcome, the device's per-process places, ledgers left)."""
    os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percent)
    try:
        with on_device(index):
            setup = with_settings(comm, KERNEL_SETTINGS, _setup)
            client = emu.residency(index)[3]
    finally:
        del os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]
    comm.barrier()
    left = [n for n in (emu.grid_claims(index)["ledger"], emu.residency(index)[0]) if _C.shared_ledger_exists(n)]
    return setup, client, left


def capped_jobs_cuda(comm, iterations):
    """capped_jobs on a real GPU (every rank on GPU 0, torch CUDA tensors; the ledger keyed by the
    GPU's UUID): ranks 0-1 and 2-3 two jobs, each at COMMLIB_DEVICE_GRID_PERCENT=50, `iterations`
    kernel-path all_reduces each at once with the other. Returns (every result right, the grant,
    the path, the error if one was raised)."""
    import torch
    torch.cuda.set_device(0)
    with overridden({"COMMLIB_DEVICE_PATH": "kernel", "COMMLIB_DEVICE_GRID_PERCENT": "50"}):
        sub = comm.split(comm.rank // 2, timeout=60)
        ok, grant, path, error = True, None, None, None
        try:
            for i in range(iterations):
                x = torch.full((1 << 16,), float(sub.rank + 1 + i), dtype=torch.float32, device="cuda")
                sub.all_reduce(x)
                want = float(sum(r + 1 + i for r in range(sub.size)))
                ok = ok and bool((x == want).all().item())
            grant, path = _engine(sub).kernel_grid_budget(), _engine(sub).last_path()
        except Exception as e:  # noqa: BLE001 - the test shows what a hang turned into
            ok, error = False, f"{type(e).__name__}: {e}"
        finally:
            comm.barrier()  # both jobs held their claims at once
            sub.close()
    comm.barrier()
    return ok, grant, path, error
