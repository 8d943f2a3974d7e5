"""Rank side of test_foreign_arrays.py: other libraries' device arrays (__cuda_array_interface__,
DLPack: foreign_arrays.py's views over emulated memory) through the C++ entry, as commlib's own
arrays go (csrc/bindings/foreign_arrays.cc)."""
import numpy as np

import commlib._C as _C
import commlib.emulated as emu
from call_count_cases import steady_call_counts
from fast_device_call_cases import every_collective_hits
from foreign_arrays import DL_CUDA_HOST, IS_COPIED, READ_ONLY, CudaArrayView, DLPackView
from kernel_path_cases import KERNEL_SETTINGS, with_settings

# How a test wraps an emulated array: a new view per call (a caller making one for each call).
WRAPS = {"cai": CudaArrayView, "dlpack": DLPackView, "dlpack0": lambda a: DLPackView(a, versioned=False)}


def _once(wrap):
    """wrap, but one view per array, made on first use (a caller passing the same array each time)."""
    views = {}

    def view(a):
        v = views.get(id(a))
        if v is None:
            v = views[id(a)] = (wrap(a), a)
        return v[0]
    return view


def foreign_every_collective_hits(comm, kind, k=3):
    return every_collective_hits(comm, k, wrap=WRAPS[kind])


def foreign_steady_call_counts(comm, kind, n):
    return steady_call_counts(comm, n, wrap=_once(WRAPS[kind]), names=("all_reduce", "all_gather"))


def _bad_views(x, g_out):
    return [
        ("cai read-only", "tensor", CudaArrayView(x, readonly=True), "ValueError: tensor: CUDA array is read-only"),
        ("cai strided", "tensor", CudaArrayView(x[:2], strides=(8,)), "ValueError: tensor: CUDA array must be C-contiguous"),
        ("cai dtype", "tensor", CudaArrayView(x, typestr="<c8", shape=(2,)),
         "TypeError: tensor: unsupported CUDA array typestr '<c8'"),
        ("cai mask", "tensor", CudaArrayView(x, mask=CudaArrayView(x).__cuda_array_interface__),
         "ValueError: tensor: masked CUDA arrays"),
        ("dlpack read-only", "tensor", DLPackView(x, flags=READ_ONLY), "ValueError: tensor: DLPack array is read-only"),
        ("dlpack copy", "tensor", DLPackView(x, flags=IS_COPIED), "ValueError: tensor: DLPack export is a copy"),
        ("dlpack strided", "tensor", DLPackView(x[:2], strides=(2,)), "ValueError: tensor: DLPack array must be C-contiguous"),
        ("dlpack dtype", "tensor", DLPackView(x, dtype=(5, 64), shape=(2,)), "TypeError: tensor: unsupported DLPack dtype"),
        ("dlpack wrong device", "tensor", DLPackView(x, device_id=x.device_index + 1),
         f"ValueError: tensor: DLPack names device {x.device_index + 1} but its memory is on emulated:{x.device_index}"),
        ("dlpack pinned host", "tensor", DLPackView(x, device_type=DL_CUDA_HOST),
         "ValueError: tensor: is on DLPack device type 3 (CUDA pinned host memory)"),
        ("all_gather output read-only", "output", CudaArrayView(g_out, readonly=True),
         "ValueError: output: CUDA array is read-only"),
        ("all_gather input copy", "input", DLPackView(x[:2], flags=IS_COPIED), "ValueError: input: DLPack export is a copy"),
    ]


def foreign_bad_arrays(comm):
    """After hits of good views of the same memory, views no collective takes raise naming the
    argument, and never run in C++: ([(label, C++ hits, error, expected start)], results right)."""
    def run(sub):
        P = sub.size
        x = emu.from_numpy(np.full(4, sub.rank, np.float32))
        g_in = emu.from_numpy(np.full(2, sub.rank, np.float32))
        g_out = emu.empty(2 * P)
        for _ in range(3):
            sub.all_reduce(CudaArrayView(x), op="max")
            sub.all_reduce(DLPackView(x), op="max")
            sub.all_gather(CudaArrayView(g_out), DLPackView(g_in))
        errors = []
        for label, name, view, start in _bad_views(x, g_out):
            def call():
                if name == "tensor":
                    return sub.all_reduce(view, op="max")
                if name == "output":
                    return sub.all_gather(view, DLPackView(g_in))
                return sub.all_gather(CudaArrayView(g_out), view)
            before = _C.device_fast_path_counts()[1]
            try:
                call()
                error = None
            except (TypeError, ValueError) as e:
                error = f"{type(e).__name__}: {e}"
            errors.append((label, _C.device_fast_path_counts()[1] - before, error, start))
        ok = bool((x.numpy() == P - 1).all()) and bool((g_out.numpy() == np.repeat(np.arange(P), 2)).all())
        return errors, ok
    return with_settings(comm, KERNEL_SETTINGS, run)
