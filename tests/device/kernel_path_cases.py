"""What the kernel-path tests (test_kernel_path.py) run in the rank processes. Apart from the test
module so that a pool's ranks unpickling these functions import neither pytest nor the test
modules (a few seconds of CPU per rank on the shared machine)."""
import io

import device_cases
from commlib.settings import overridden

KERNEL_SETTINGS = {"COMMLIB_DEVICE_PATH": "kernel", "COMMLIB_DEVICE_SLOT_BYTES": "4096",
                   "COMMLIB_DEVICE_SLOTS": "2", "COMMLIB_DEVICE_LL_BYTES": "1024"}
BIG_SETTINGS = dict(KERNEL_SETTINGS, COMMLIB_DEVICE_SLOT_BYTES="32768")


def with_settings(comm, settings, fn, *args):
    """fn(sub, *args) on a sub-communicator whose engine is created with `settings` in the
    environment (the pool's own communicator keeps its engine and settings)."""
    with overridden(settings):  # the engine is made at the sub-communicator's first device call
        sub = comm.split(0, timeout=60)
        try:
            return fn(sub, *args)
        finally:
            sub.close()


def kernel_matrix(comm, small, big):
    """`small` cases with the kernel settings, `big` ones with larger slots: (failures, digests,
    the paths the calls ran on, how many cases ran)."""
    paths, ran = set(), []

    def run(sub, cases_):
        fails, digests = [], []
        for c in cases_:
            f, d = device_cases.check_cases(sub, [c])
            fails += f
            digests += d
            paths.add(sub._device_route.last_path())
            ran.append(c)
        return fails, digests
    f1, d1 = with_settings(comm, KERNEL_SETTINGS, run, small)
    f2, d2 = with_settings(comm, BIG_SETTINGS, run, big) if big else ([], [])
    return f1 + f2, d1 + d2, sorted(paths), len(ran)


def _paths(comm):
    """The path auto takes for a small and a large all_reduce."""
    import numpy as np

    import commlib.emulated as emu
    out = []
    for n in (1000, (1 << 20) // 4 + 1):  # 4 000 bytes; one element over 1 MiB
        x = emu.from_numpy(np.ones(n, np.float32))
        comm.all_reduce(x)
        out.append((comm._device_route.last_path(), bool((x.numpy() == comm.size).all())))
    return out


def paths_per_setting(comm, settings):
    return [with_settings(comm, {"COMMLIB_DEVICE_PATH": s}, _paths) for s in settings]


def mixed_settings(comm, settings_of_rank1, settings_of_rank0, late_rank=None):
    """Rank 1 creates its engine with one setting, rank 0 with another; ``late_rank`` (if given)
    makes its call 0.3 s after the other's, so the early rank's first call is published while the
    late one checks its own against it during the set-up (the two resolve auto differently by path:
    a check that saw that as a mismatch raised MismatchError instead of the setting's ValueError
    whenever it met its peer's published call, the flake of the copy-kernel case)."""
    import time

    import numpy as np

    import commlib
    import commlib.emulated as emu

    def run(sub):
        try:
            if sub.rank == late_rank:
                time.sleep(0.3)
            x = emu.from_numpy(np.ones(4, np.float32))
            sub.all_reduce(x, async_op=True).synchronize()  # raises the call's own error too
            return "no error"
        except (ValueError, commlib.CommError) as e:
            return f"{type(e).__name__}: {e}"
    return with_settings(comm, settings_of_rank1 if comm.rank == 1 else settings_of_rank0, run)


def sweep_paths(comm, cfg):
    """The device bench's sweep in a pool rank (as `commlib bench --device emulated --paths ...`
    runs it, without starting processes): the records, the backend's info, the transport."""
    from commlib.bench.device import DeviceBackend
    from commlib.bench.sweep import Sweep
    from commlib.perf import common as C
    C.use_device("emulated")
    backend = DeviceBackend(comm, "emulated", paths=cfg["paths"])
    try:
        sw = Sweep(backend, cfg, out=io.StringIO())
        records = sw.run()
        return records, backend.extra_info(cfg), backend.transport, sw.wrong_total
    finally:
        backend.close()  # its sub-communicators; the pool's own stays open
        C.use_device("host")
