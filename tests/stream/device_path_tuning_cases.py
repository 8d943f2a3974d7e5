"""What the ranks of tests/stream/test_device_path_tuning.py run (importable by the pool's ranks)."""
from kernel_path_cases import mixed_settings


def with_table_of_rank(comm, tables, settings):
    """mixed_settings' first call (a small auto all_reduce on a sub-communicator whose engine is
    created with ``settings``) after this rank installed ``tables[rank]`` (the default table put
    back after): the error it raised, or "no error"."""
    from commlib import _C
    from commlib.core import tuning
    _C.clear_tuning()
    tuning.install(tables[comm.rank])
    try:
        return mixed_settings(comm, settings, settings)
    finally:
        _C.clear_tuning()  # the crossovers too
        tuning.load_default()


def tune_on_the_device(comm, cfg):
    """The device bench's sweep over the kernel and copy paths, then the tuning table rank 0 would
    write from its records, installed: (the table, what auto resolves and the path it takes for
    each of the sweep's sizes on a fresh auto sub-communicator)."""
    import numpy as np

    import commlib.emulated as emu
    from commlib import _C
    from commlib.bench import tuning
    from commlib.core.call_spec import COLLECTIVE, DTYPE
    from kernel_path_cases import sweep_paths, with_settings
    import json
    records = sweep_paths(comm, cfg)[0]
    # each rank's records hold its own times; the bench writes rank 0's table, which every rank loads
    blob = np.frombuffer(json.dumps(tuning.from_results(records)).encode().ljust(1 << 16), np.uint8).copy()
    comm.broadcast(blob, root=0)
    table = json.loads(blob.tobytes().decode().rstrip())
    _C.clear_tuning()
    tuning.install(table)

    def run(sub):
        out = []
        for nbytes in cfg["sizes"]:
            x = emu.from_numpy(np.ones(nbytes // 4, np.float32))
            sub.all_reduce(x)
            engine = sub._device()._last_engine
            out.append((engine.resolved_algorithm(COLLECTIVE["all_reduce"], "auto", nbytes // 4, DTYPE["float32"]),
                        sub._device_route.last_path(), bool((x.numpy() == sub.size).all())))
        return out
    try:
        return table, with_settings(comm, {"COMMLIB_DEVICE_PATH": "auto"}, run)
    finally:
        _C.clear_tuning()
        tuning.load_default()
