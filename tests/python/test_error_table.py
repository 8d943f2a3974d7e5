"""The one mapping of the core's error kinds to Python classes (csrc/bindings/error_kinds.h): the
table that the bindings raise through (set_python_error) and that `_C.core_api()` hands other
extension modules (`CoreApi::error_class`, so the torch backend needs no mapping of its own)."""
import pytest

from commlib import _C, errors


@pytest.mark.parametrize("kind, cls", [
    (1, errors.CommError), (2, errors.MismatchError), (3, errors.PeerError),
    (100, ValueError), (101, RuntimeError), (102, MemoryError), (0, RuntimeError), (7, RuntimeError),
])
def test_each_kind_is_one_class(kind, cls):
    assert _C.error_class(kind) is cls
