"""The call spec: the host engine's bindings take collective, dtype and op as the extension's
enums, converted once at the Python API's edge (commlib/core/call_spec.py), not as names that C++
parses back."""
import re

import pytest

import commlib._C as _C
from commlib.core.call_spec import COLLECTIVE, DTYPE, OP


def test_every_name_has_its_enum_in_cpp_order():
    for names, table in ((_C.DTYPES, DTYPE), (_C.OPS, OP), (_C.COLLECTIVES, COLLECTIVE)):
        assert list(table) == list(names)
        assert [int(table[n]) for n in names] == list(range(len(names)))


@pytest.mark.parametrize("method, enums", [("run", ("Collective", "DType", "RedOp")), ("p2p", ("DType",)),
                                           ("recv_any", ("DType",))])
def test_host_bindings_take_enums_not_names(method, enums):
    sig = getattr(_C.Communicator, method).__doc__.splitlines()[0]
    for enum in enums:
        assert f"commlib._C.{enum}" in sig, sig



@pytest.mark.parametrize("cls, method, enums", [
    ("StreamEngine", "run", ("Collective", "DType", "RedOp")), ("StreamEngine", "p2p", ("DType",)),
    ("StreamEngine", "resolved_algorithm", ("Collective", "DType")),
    ("StreamEngine", "check_first_call", ("Collective", "DType", "RedOp")),
    ("StreamEngine", "check_first_p2p", ("DType",)), ("Device", "reduce", ("DType", "RedOp")),
    ("Device", "scale_copy", ("DType",)), ("Device", "divide", ("DType",))])
def test_device_bindings_take_enums_not_names(cls, method, enums):
    # The device route passes the same call spec (commlib/core/device_route.py): the stream
    # engine's and the device's bindings parse no collective, dtype or op name back.
    sig = getattr(getattr(_C, cls), method).__doc__.splitlines()[0]
    for enum in enums:
        assert f"commlib._C.{enum}" in sig, sig
    assert set(re.findall(r"(\w+): str\b", sig)) <= {"algorithm"}, sig  # the algorithm's name only
