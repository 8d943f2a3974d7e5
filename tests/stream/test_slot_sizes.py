"""COMMLIB_DEVICE_SLOT_BYTES=0 (the default): the stream engine sizes its inbox slots from the world
size and the slot count (stream/stream_engine.h, auto_slot_bytes), the same on every rank; an
explicit size is taken as given."""
import pytest

import commlib._C as _C

KiB, MiB = 1 << 10, 1 << 20


@pytest.mark.parametrize("ranks,nslots,expected", [
    (1, 4, 4 * MiB), (2, 4, 4 * MiB), (4, 4, 4 * MiB),      # 64 MiB / 16 = 4 MiB: the cap
    (5, 4, 2 * MiB), (8, 4, 2 * MiB),                        # 3.2 MiB, 2 MiB: the power of two below
    (3, 8, 2 * MiB), (16, 4, 1 * MiB), (33, 4, 256 * KiB),   # 2.7 MiB; 1 MiB; 496 KiB -> 256 KiB
    (64, 4, 256 * KiB), (4096, 64, 256 * KiB),               # the floor
    (1, 1, 4 * MiB), (2, 64, 512 * KiB)])                   # 64 MiB / 128
def test_auto_slot_bytes(ranks, nslots, expected):
    assert _C.device_auto_slot_bytes(ranks, nslots) == expected


def _slots(comm):
    """(slots, slot bytes) the rank's engine announced to its peers."""
    import numpy as np

    import commlib.emulated as emu
    comm.all_reduce(emu.from_numpy(np.ones(4, np.float32)))
    emu.synchronize()
    handle = comm._device_route._last_engine.local_handle()
    part = next(p for p in handle.split(";") if p.startswith("slots:"))
    _, n, b = part.split(":")
    return int(n), int(b)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("env,expected", [({}, (4, 4 * MiB)),
                                          ({"COMMLIB_DEVICE_SLOTS": "8"}, (8, 2 * MiB)),
                                          ({"COMMLIB_DEVICE_SLOT_BYTES": "4K"}, (4, 4096))])
def test_engines_take_the_resolved_size(pool, env, expected):
    assert pool(3, env=env).run(_slots, timeout=40) == [expected] * 3


def _split_waits(comm):
    """{bytes: (peer waits per call, results right)} of a `direct` all_reduce on the kernel path with
    the auto slots (4 MiB at 3 ranks): a split chunk (plan_kernel.cuh) is waited for by every block
    of the grid, an unsplit one by its own block only."""
    import numpy as np

    import commlib.emulated as emu
    from commlib.settings import overridden
    out = {}
    with overridden({"COMMLIB_DEVICE_PATH": "kernel"}):  # the engine is made at the first device call
        sub = comm.split(0, timeout=30)
    try:
        for nbytes in (16 * KiB, 64 * KiB, 512 * KiB, 2 * MiB):
            x = emu.from_numpy(np.ones(nbytes // 4, np.float32))
            for _ in range(5):  # past the slots' first use (COMMLIB_DEVICE_SLOTS = 4): every send waits too
                sub.all_reduce(x, algorithm="direct")
            emu.synchronize()
            emu.kernel_counters(reset=True)
            x = emu.from_numpy(np.ones(nbytes // 4, np.float32))
            for _ in range(2):
                sub.all_reduce(x, algorithm="direct")
            emu.synchronize()
            waits = emu.kernel_counters(reset=True)["peer_waits"] / 2
            out[nbytes] = (waits, bool((x.numpy() == comm.size ** 2).all()), sub._device().last_path())
    finally:
        sub.close()
    return out


@pytest.mark.timeout(60)
def test_chunks_under_a_mebibyte_are_not_split_over_the_grid(pool):
    # Session 31's H200 run: with 64 KiB chunks split over the 16-block grid (the threshold was
    # min(64 KiB, half a slot)) a direct all_reduce took 412 us at 64 KiB against 74 at 16 KiB;
    # every block waited for every chunk (27 waits per call here against 9 at 16 KiB, 4 blocks).
    # Chunks split from min(1 MiB, half a slot) (kernel_path.h kSplitMaxBytes).
    for per_size in pool(3, env={}).run(_split_waits, timeout=50):
        assert all(ok and path == "kernel" for _, ok, path in per_size.values()), per_size
        unsplit = per_size[16 * KiB][0]
        assert per_size[64 * KiB][0] == unsplit and per_size[512 * KiB][0] == unsplit, per_size
        assert per_size[2 * MiB][0] > unsplit, per_size  # 2 MiB chunks are split: every block waits
