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
