"""What the kernel-path tests (test_kernel_path.py) run in the rank processes. Apart from the test
module so that a pool's ranks unpickling these functions import neither pytest nor the test
modules (a few seconds of CPU per rank on the shared machine)."""
import io

import device_cases
from commlib.settings import overridden

KERNEL_SETTINGS = {"COMMLIB_DEVICE_PATH": "kernel", "COMMLIB_DEVICE_SLOT_BYTES": "4096",
                   "COMMLIB_DEVICE_SLOTS": "2", "COMMLIB_DEVICE_LL_BYTES": "1024"}
BIG_SETTINGS = dict(KERNEL_SETTINGS, COMMLIB_DEVICE_SLOT_BYTES="32768")
COPY_SETTINGS = dict(KERNEL_SETTINGS, COMMLIB_DEVICE_PATH="copy")


def with_settings(comm, settings, fn, *args):
    """fn(sub, *args) on a sub-communicator whose engine is created with `settings` in the
    environment (the pool's own communicator keeps its engine and settings)."""
    with overridden(settings):  # the engine is made at the sub-communicator's first device call
        sub = comm.split(0, timeout=60)
        try:
            return fn(sub, *args)
        finally:
            sub.close()


def per_path(comm, fn, *args):
    """fn(sub, *args) on the kernel path, then the same on the copy path (each its own
    sub-communicator): [kernel's result, copy's]. The counting tests (test_call_structure.py,
    test_kernel_call_check.py) measure a counter on the kernel path and check on the copy path that
    it counts."""
    return [with_settings(comm, settings, fn, *args) for settings in (KERNEL_SETTINGS, COPY_SETTINGS)]


def counted(counter, calls):
    """(counter() after calls() minus before, what calls() returned). A counter gives an int, or a
    dict of counts (then the difference holds the keys that changed)."""
    before = counter()
    result = calls()
    after = counter()
    if isinstance(before, dict):
        return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}, result
    return after - before, result


def check_kernel_and_copy(per_path_results):
    """The counts of per_path's [(count, path, ok)]: (kernel's, copy's), once each call is known to
    have taken its path and given the right results."""
    (kernel, kernel_path, kernel_ok), (copy, copy_path, copy_ok) = per_path_results
    assert kernel_path == "kernel" and copy_path == "copy", (kernel_path, copy_path)
    assert kernel_ok and copy_ok, (kernel_ok, copy_ok)
    return kernel, copy


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


def sweep_paths(comm, cfg, settings=None, with_text=False):
    """The device bench's sweep in a pool rank (as `commlib bench --device emulated --paths ...`
    runs it, without starting processes): the records, the backend's info, the transport (and
    with_text: what the sweep printed). `settings`: in the environment while the paths' engines
    are created."""
    from commlib.bench.device import DeviceBackend
    from commlib.bench.sweep import Sweep
    from commlib.perf import common as C
    C.use_device("emulated")
    with overridden(settings or {}):
        backend = DeviceBackend(comm, "emulated", paths=cfg["paths"])
    try:
        out = io.StringIO()
        sw = Sweep(backend, cfg, out=out)
        records = sw.run()
        res = records, backend.extra_info(cfg), backend.transport, sw.wrong_total
        return res + (out.getvalue(),) if with_text else res
    finally:
        backend.close()  # its sub-communicators; the pool's own stays open
        C.use_device("host")
