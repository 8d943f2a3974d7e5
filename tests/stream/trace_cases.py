"""What the kernel-path trace test (test_kernel_trace.py) runs in the rank processes: one
mapped_fused_two_shot (a one-sided plan) and one two_shot (a message plan) all_reduce, each after a
warm-up, traced (COMMLIB_DEVICE_TRACE=1) and not. Apart from the test module so that ranks do not
import pytest."""
from kernel_path_cases import with_settings
from one_sided_cases import SETTINGS

COUNT = 1500  # float32 per rank: 4 blocks of the one-sided grid (64 bytes per block), several message chunks
ALGOS = ("mapped_fused_two_shot", "two_shot")


def traced_calls(comm, trace):
    """Per algorithm: (this rank's trace records, trace stores the kernel counted, blocks run, the
    plan's steps, whether the sum was right) of the second of two calls."""
    import numpy as np

    from commlib import _C
    import commlib.emulated as emu
    from commlib.bench.device_trace import rank_trace

    def run(sub):
        out = {}
        for algo in ALGOS:
            x = emu.from_numpy(np.full(COUNT, sub.rank + 1, np.float32), shareable=True)
            y = emu.from_numpy(np.zeros(COUNT, np.float32), shareable=True)
            sub.all_reduce(x, out=y, algorithm=algo)
            emu.synchronize()
            emu.kernel_counters(reset=True)
            sub.all_reduce(x, out=y, algorithm=algo)
            emu.synchronize()
            c = emu.kernel_counters()
            plan = _C.device_plan(_C.Collective.all_reduce, algo, sub.rank, sub.size, COUNT, esize=4,
                                  chunk_bytes=int(SETTINGS["COMMLIB_DEVICE_SLOT_BYTES"]))
            blocks = c["block_runs"] + c["message_blocks"]
            ok = bool(np.all(y.numpy() == sub.size * (sub.size + 1) / 2))
            out[algo] = (rank_trace(sub), c["trace_stores"], blocks, len(plan["steps"]), ok)
        return out
    return with_settings(comm, dict(SETTINGS, COMMLIB_DEVICE_TRACE="1" if trace else "0"), run)
