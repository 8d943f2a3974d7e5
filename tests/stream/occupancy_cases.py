"""Rank side of test_kernel_occupancy.py (apart from the test module so that the ranks import
neither pytest nor the test modules): the kernel path's grid against the emulated device's
resident-block limit (COMMLIB_EMULATED_RESIDENT_BLOCKS, set for the whole pool), and two
communicators' kernels on one device."""
import contextlib
import time

import numpy as np

import commlib.emulated as emu
from commlib.settings import overridden
from kernel_path_cases import KERNEL_SETTINGS, with_settings

SPLIT_COUNT = 8192  # 32 KiB of float32 over 4 KiB slots: split items, which want every block


@contextlib.contextmanager
def on_device(index):
    """This process's emulated device is `index` inside the block (fresh devices read the limit)."""
    previous = emu.current_device()
    emu.set_device(index)
    try:
        yield emu.device(index)
    finally:
        emu.set_device(previous)


def _engine(sub):
    return next(iter(sub._device()._engines.values()))


def sized_to_fit(comm):
    """Each rank on its own device holding 1 resident block: a call wanting every block runs on
    one. Returns (right result, the grid's budget, its path)."""
    with on_device(40 + comm.rank):
        def run(sub):
            x = emu.from_numpy(np.full(SPLIT_COUNT, sub.rank + 1, np.float32))
            sub.all_reduce(x)
            ok = bool((x.numpy() == sub.size * (sub.size + 1) / 2).all())
            engine = _engine(sub)
            return ok, engine.kernel_grid_budget(), engine.last_path()
        return with_settings(comm, KERNEL_SETTINGS, run)


def refused_or_copied(comm):
    """Both ranks on one device holding 1 resident block (no block left for each): the kernel
    path refuses with COMMLIB_DEVICE_PATH=kernel (the message), and auto takes the copy path
    (right result, the path)."""
    with on_device(50):
        def kernel(sub):
            try:
                sub.all_reduce(emu.from_numpy(np.ones(4, np.float32)))
            except ValueError as e:
                return str(e)
            return "no error"

        def auto(sub):
            x = emu.from_numpy(np.full(16, sub.rank + 1, np.float32))
            sub.all_reduce(x)
            return bool((x.numpy() == 3).all()), _engine(sub).last_path(), _engine(sub).kernel_usable()
        message = with_settings(comm, KERNEL_SETTINGS, kernel)
        return message, with_settings(comm, dict(KERNEL_SETTINGS, COMMLIB_DEVICE_PATH="auto"), auto)


def two_communicators(comm):
    """Two communicators' kernel-path calls on two streams of a device holding 1 resident block,
    each rank on its own device. Rank 1 holds the first communicator's stream at a gate and opens
    it a moment after enqueueing the second's call, so without the launch chain its second kernel
    takes the device's only place first while rank 0's first kernel holds rank 0's: each waits for
    the other's peer (a deadlock, until the timeout). Returns whether both results are right."""
    with on_device(60 + comm.rank) as dev, overridden(KERNEL_SETTINGS):
        a, b = comm.split(0, timeout=30), comm.split(0, timeout=30)
        try:
            for sub in (a, b):  # set up both engines (their rendezvous) and warm them
                x = emu.from_numpy(np.ones(4, np.float32))
                sub.all_reduce(x)
                x.numpy()
            s1, s2, s3 = emu.Stream(), emu.Stream(), emu.Stream()
            gate = np.zeros(1, np.uint64)
            xa = emu.from_numpy(np.full(SPLIT_COUNT, comm.rank + 1, np.float32))
            xb = emu.from_numpy(np.full(SPLIT_COUNT, 10 * (comm.rank + 1), np.float32))
            emu.synchronize()
            if comm.rank == 1:
                dev.wait_value(gate.ctypes.data, 1, s1._stream)
            a.all_reduce(xa, stream=s1)
            b.all_reduce(xb, stream=s2)
            if comm.rank == 1:
                time.sleep(0.2)  # (not a timing assertion) lets the second kernel take its place first
                dev.write_value(gate.ctypes.data, 1, s3._stream)
            s1.synchronize()
            s2.synchronize()
            return bool((xa.numpy() == 3).all()) and bool((xb.numpy() == 30).all())
        finally:
            a.close()
            b.close()
