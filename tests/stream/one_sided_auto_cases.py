"""What test_one_sided_kernel.py's device-auto matrix runs in the rank processes (session 32's audit):
all_reduce with algorithm auto in the band where device auto takes the fused two-shot on mapped
buffers. Apart from the test module so that ranks do not import pytest."""
import device_cases
from kernel_path_cases import KERNEL_SETTINGS, with_settings


def auto_in_the_mapped_band(P):
    """test_one_sided_kernel.py's auto matrix: all_reduce with algorithm auto on buffers every rank
    maps, where device auto takes the fused two-shot (16 KiB-1 MiB: policy/device_auto.h rule 2's
    mapped exception): per dtype a prime count just over 16 KiB and, in turn, one near 256 KiB,
    every op in turn (avg and premul_sum too), in place or not; and the counts 0, 1, P - 1 and 13
    (direct, or nothing) around them. [(case, in the band)]."""
    from test_device_collectives import _ops
    out, k = [], P
    for dtype in device_cases.cc.DTYPES:
        esize = {"int8": 1, "uint8": 1, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8}.get(dtype, 4)
        band = [c for c in (16411, 65537, 262147) if 16384 <= c * esize <= (1 << 20)]
        for count in [band[0], band[k % len(band)] if k % 3 == 0 else None, (0, 1, max(P - 1, 0), 13)[k % 4]]:
            if count is None:
                continue
            ops = _ops(dtype)
            out.append((("all_reduce", "auto", dtype, ops[k % len(ops)], count, 0, k % 2 == 1), count * esize >= 16384))
            k += 1
    return out


def auto_matrix(comm, cases):
    """(failures, digests, the algorithm auto ran per case) of `cases` ([(case, in the band)]) on a
    kernel-path sub-communicator, buffers shareable (mapped), with the default one-sided settings
    (the cost model's inputs: COMMLIB_DEVICE_BLOCK_BYTES as shipped) and slots large enough that no
    message plan stages through a tiny area."""
    def run(sub):
        fails, digests, ran = [], [], []
        for case, _ in cases:
            f, d = device_cases.check_cases(sub, [case])
            fails += f
            digests += d
            ran.append(sub._device()._last_engine.last_algorithm())
        return fails, digests, ran
    return with_settings(comm, dict(KERNEL_SETTINGS, COMMLIB_DEVICE_SLOT_BYTES="65536"), run)
