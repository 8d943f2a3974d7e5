"""The Python side has one dtype table (commlib/device/dtypes.py), generated from C++'s
(common/types.h through _C.dtype_table()), and no module spells out a copy of it."""
import ast
import os

import numpy as np

import commlib._C as _C
from commlib.device import dtypes
from commlib.core.call_spec import DTYPE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Lists of dtypes that are deliberately not commlib's table: the subset MPI itself can reduce.
NOT_THE_TABLE = {os.path.join("commlib", "bench", "mpi_peer.py")}


def test_the_table_is_the_extensions():
    assert dtypes.NAMES == tuple(_C.DTYPES)
    assert dtypes.SIZE == {n: _C.dtype_size(DTYPE[n]) for n in _C.DTYPES}
    assert dtypes.FLOATS | dtypes.INTEGERS == set(_C.DTYPES)
    assert not dtypes.FLOATS & dtypes.INTEGERS
    for name, dt in dtypes.HOST_NUMPY.items():
        assert dt.itemsize == dtypes.SIZE[name], name
        if name != "bfloat16":  # held as uint16 bit patterns
            assert (dt.kind == "f") == (name in dtypes.FLOATS), name
    assert dtypes.HOST_NUMPY["bfloat16"] == np.uint16


def _dtype_names(node):
    """The dtype names a literal spells: "float32" strings and torch.float32 attributes."""
    out = set()
    for elt in ast.walk(node):
        if isinstance(elt, ast.Constant) and elt.value in dtypes.SIZE:
            out.add(elt.value)
        elif isinstance(elt, ast.Attribute) and elt.attr in dtypes.SIZE:
            out.add(elt.attr)
    return out


def test_no_module_copies_the_table():
    copies = []
    for d, _, files in os.walk(os.path.join(ROOT, "commlib")):
        for f in files:
            path = os.path.join(d, f)
            rel = os.path.relpath(path, ROOT)
            if not f.endswith(".py") or rel in NOT_THE_TABLE:
                continue
            for node in ast.walk(ast.parse(open(path).read(), path)):
                # four or more dtypes in one literal is a list of them (fully_sharded's
                # mixed-precision spellings name only the two half types and float32).
                if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and len(_dtype_names(node)) >= 4:
                    copies.append(f"{rel}:{node.lineno}")
    assert not copies, f"dtype lists outside commlib/device/dtypes.py: {copies}"
