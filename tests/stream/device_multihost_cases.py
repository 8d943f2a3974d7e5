"""Rank-side cases of device calls across emulated hosts (test_device_multihost.py): what each
engine mapped and which peers it reaches over NCCL. The collective matrix, mismatches, kills and
point-to-point cases are device_cases', device_error_cases', nccl_cases' and device_p2p_cases'."""
from __future__ import annotations

import numpy as np

import commlib.emulated as emu
from commlib import _C, settings, tuning
from commlib.core.call_spec import COLLECTIVE, DTYPE
from commlib.sim import topology as sim_topology


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
    """[(collective, count, host's auto, device's auto, auto without the host map, how the policy
    decides with it)] over several shapes. The host's is what the communicator resolves auto to
    (comm auto_choice); the device's the plan the stream engine runs for the same call; then what
    the size policy alone picks on one host (the device's resolution before the one lowering):
    where it differs from the host's, a device path that ignored the host map would show; last the
    policy's own resolution with the host map and COMMLIB_TOPOLOGY's model, (algorithm, source).
    The tuning table is cleared so that, with COMMLIB_TOPOLOGY set, the cost model decides (the
    table would win where it has the shape)."""
    _C.clear_tuning()
    try:
        x = emu.from_numpy(np.ones(4, np.float32))
        comm.all_reduce(x)  # starts the engine
        x.numpy()
        engine = next(iter(comm._device()._engines.values()))
        spec, hosts = settings.get("COMMLIB_TOPOLOGY"), list(comm._core.host_of)
        model = sim_topology.load(spec).engine_dict(comm.size) if spec else None
        out = []
        for coll in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all"):
            for count in (1, 1000, 70_001, 1 << 20):
                host = comm._core.auto_choice(COLLECTIVE[coll], count * 4, 4)  # float32, as the device call
                device = engine.resolved_algorithm(COLLECTIVE[coll], "auto", count, DTYPE["float32"], 0)
                one_host = _C.resolve_algorithm(COLLECTIVE[coll], "auto", count, 4, 0, comm.size, [], None)["algorithm"]
                policy = _C.resolve_algorithm(COLLECTIVE[coll], "auto", count, 4, 0, comm.size, hosts, model)
                out.append((coll, count, host, device, one_host, (policy["algorithm"], policy["source"])))
        return out
    finally:
        tuning.load_default()
