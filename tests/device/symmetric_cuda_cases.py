"""Rank side of test_symmetric_cuda.py (apart from the test module so that the ranks import
neither pytest nor the test modules): the symmetric pool on a CUDA device, several ranks on GPU 0."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "stream"))
from kernel_path_cases import KERNEL_SETTINGS, with_settings  # noqa: E402


def symmetric_pool_on_cuda(comm):
    """Pool blocks as torch tensors (both protocols, the same memory), bfloat16 through DLPack,
    CuPy's view where CuPy is installed, a ring all_reduce and a mapped one-sided all_reduce on
    them (the arena the only registration, mapped once), and every arena freed at close:
    [(what, ok)]."""
    import gc

    import torch

    import commlib.device as cdev
    from commlib.device.symmetric import pool_of
    kept = {}

    def run(sub):
        P, r = sub.size, sub.rank
        kept["pool"] = pool_of(sub, "cuda:0")
        out = []
        a = cdev.empty((4, 1000), "float32", comm=sub, device="cuda:0")
        t = torch.as_tensor(a, device="cuda:0")  # __cuda_array_interface__
        u = a.torch()  # DLPack
        out.append(("one memory", t.data_ptr() == u.data_ptr() == a.data_ptr() and tuple(t.shape) == (4, 1000)))
        t.fill_(r + 1)
        sub.all_reduce(t)
        torch.cuda.synchronize()
        out.append(("all_reduce", bool((u == P * (P + 1) / 2).all())))
        sub.all_reduce(t, algorithm="mapped_two_shot")
        torch.cuda.synchronize()
        out.append(("mapped all_reduce", bool((u == P * P * (P + 1) / 2).all())))
        engine = next(iter(sub._device()._engines.values()))
        out.append(("one registration, one arena", (engine.peer_buffer_stats()["registered"],
                                                    engine.symmetric_arenas()) == (1, 1)))
        h = cdev.empty(64, "bfloat16", comm=sub, device="cuda:0").torch()
        out.append(("bfloat16", h.dtype == torch.bfloat16 and h.is_cuda))
        try:
            import cupy
            out.append(("cupy", cupy.asarray(a).data.ptr == a.data_ptr()))
        except ImportError:
            pass
        del t, u, h, a
        return out
    out = with_settings(comm, KERNEL_SETTINGS, run)
    gc.collect()
    torch.cuda.synchronize()
    return out + [("freed at close", kept["pool"].arenas() == 0)]
