"""The one dtype table of the Python side, generated from the extension (``_C.dtype_table()``:
the names csrc/common/types.h defines, their sizes and float-ness) with how NumPy, torch, the CUDA
array interface and DLPack spell each dtype commlib moves. Host and device buffers, the emulated
device, the argument checks, the torch layer and the bench read it, so a dtype added in C++
appears everywhere at once."""
from __future__ import annotations

import numpy as np

import commlib._C as _C

_TABLE = _C.dtype_table()  # [(name, size, is_float)] in C++'s enum order
NAMES = tuple(name for name, _, _ in _TABLE)
SIZE = {name: size for name, size, _ in _TABLE}
FLOATS = frozenset(name for name, _, is_float in _TABLE if is_float)
INTEGERS = frozenset(NAMES) - FLOATS
# NumPy has no bfloat16 of its own (ml_dtypes' is recognised by name where buffers are read).
NUMPY = {np.dtype(n): n for n in NAMES if n != "bfloat16"}
# name -> the NumPy dtype that holds its elements on the host (bfloat16: its uint16 bit patterns).
HOST_NUMPY = {**{n: d for d, n in NUMPY.items()}, "bfloat16": np.dtype(np.uint16)}
# str(torch.dtype) -> name, so that modules need not import torch to read a tensor's dtype.
TORCH = {f"torch.{n}": n for n in NAMES}
# __cuda_array_interface__ typestr -> name: single bytes carry either byte-order mark.
TYPESTR = {**{d.str: n for d, n in NUMPY.items()},
           **{d.str.replace("|", "<"): n for d, n in NUMPY.items() if d.itemsize == 1}}
# DLPack (code, bits) -> name; codes from dlpack.h: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4.
DLPACK = {**{({"i": 0, "u": 1, "f": 2}[d.kind], d.itemsize * 8): n for d, n in NUMPY.items()}, (4, 16): "bfloat16"}


def torch_dtypes(torch) -> dict:
    """{torch.dtype: name} for the torch module given (imported by the caller that has it)."""
    return {getattr(torch, n): n for n in NAMES}


# The C++ reader of other libraries' device arrays (csrc/bindings/foreign_arrays.cc) reads these.
_C.register_foreign_dtypes({t: getattr(_C.DType, n) for t, n in TYPESTR.items()},
                           {k: getattr(_C.DType, n) for k, n in DLPACK.items()})
