"""Rank-side cases of device calls across emulated hosts (test_device_multihost.py): what each
engine mapped and which peers it reaches over NCCL. The collective matrix, mismatches, kills and
point-to-point cases are device_cases', device_error_cases', nccl_cases' and device_p2p_cases'."""
from __future__ import annotations

import numpy as np

import commlib.emulated as emu


def reach(comm):
    """(peers whose control region this rank mapped, NCCL carries some peer) after a device
    call: only peers on this rank's host are mapped, the others are on NCCL."""
    x = emu.from_numpy(np.ones(4, np.float32))
    comm.all_reduce(x)
    x.numpy()
    engine = next(iter(comm._device()._engines.values()))
    return engine.mapped_peers(), engine.nccl_carries_any()


def ipc_across_hosts_refused(comm):
    """COMMLIB_DEVICE_LINK=ipc with ranks on two hosts: the first device call raises ValueError
    naming the setting (peer memory reaches only ranks of one host). Runs on a split."""
    import os
    os.environ["COMMLIB_DEVICE_LINK"] = "ipc"
    sub = comm.split(0, timeout=30)
    try:
        sub.all_reduce(emu.from_numpy(np.ones(4, np.float32)))
        return None
    except ValueError as e:
        return str(e)
    finally:
        del os.environ["COMMLIB_DEVICE_LINK"]
        sub.close()


def host_and_device_choices(comm):
    """[(collective, count, host's auto, device's auto)] over several shapes: the host's choice
    (comm auto_choice) and the algorithm the device engine resolves the same call to."""
    x = emu.from_numpy(np.ones(4, np.float32))
    comm.all_reduce(x)  # starts the engine
    x.numpy()
    engine = next(iter(comm._device()._engines.values()))
    out = []
    for coll in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all"):
        for count in (1, 1000, 1 << 20):
            host = comm._core.auto_choice(coll, count * 4)
            out.append((coll, count, host, engine.resolved_algorithm(coll, "auto", count, "float32", 0)))
    return out
