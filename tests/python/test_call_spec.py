"""The call spec: the bindings take collective, dtype and op as the extension's enums, converted
once at the Python API's edge (commlib/core/call_spec.py), not as names that C++ parses back; a bad
name from the Python API is still a ValueError naming the argument, raised before anything runs."""
import os
import re

import pytest

import commlib
import commlib._C as _C
from commlib.core import call_spec, tuning
from commlib.core.call_spec import COLLECTIVE, DTYPE, OP

BINDINGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "csrc",
                        "bindings")
_PARSE = re.compile(r"\bparse_(?:dtype|op|collective)\w*\(")
# Where a binding still reads a name, and why, with the most parses it may hold (a new one fails
# too).
STILL_PARSING = {
    "cuda_module.cc": (4, "commlib._C_cuda's synchronous kernels for GPU tests: a separate module that shares no "
                          "types with _C, so its callers pass names"),
    "call_names.h": (1, "the one table of op and algorithm names of the C++ entry from Python (fast_call.cc): "
                        "the user's op name reaches C++ before any Python runs (interned pointers compared first)"),
    "call_names.cc": (1, "its definition"),
    "fast_call.cc": (1, "the C++ entry (host calls and the device call cache): a name it does not know falls back "
                        "to the general path"),
}


def test_every_name_has_its_enum_in_cpp_order():
    for names, table in ((_C.DTYPES, DTYPE), (_C.OPS, OP), (_C.COLLECTIVES, COLLECTIVE)):
        assert list(table) == list(names)
        assert [int(table[n]) for n in names] == list(range(len(names)))


def test_no_binding_parses_a_name_outside_the_allow_list():
    found = {}
    for f in sorted(os.listdir(BINDINGS)):
        if f.endswith((".cc", ".h")):
            n = len(_PARSE.findall(open(os.path.join(BINDINGS, f)).read()))
            if n:
                found[f] = n
    for f, n in found.items():
        assert f in STILL_PARSING, f"csrc/bindings/{f} parses {n} name(s): take the call spec's enums instead"
        most = STILL_PARSING[f][0]
        assert most is None or n <= most, f"csrc/bindings/{f} parses {n} names, {most} allowed ({STILL_PARSING[f][1]})"


ENUM_TAKING = {  # binding -> the enums its signature names
    "algorithms": ("Collective",), "schedule": ("Collective", "DType"), "verify": ("Collective", "DType"),
    "_verify_custom": ("Collective",), "choose_algorithm": ("Collective",), "set_tuning": ("Collective",),
    "algorithm_info": ("Collective",), "register_algorithm": ("Collective",),
    "unregister_algorithm": ("Collective",), "buffer_shapes": ("Collective",), "dtype_size": ("DType",),
    "simulate": ("Collective",), "search_candidates": ("Collective",), "candidate_lower_bound": ("Collective",),
    "predict_candidates": ("Collective",), "resolve_algorithm": ("Collective",), "device_plan": ("Collective",),
    "check_device_plan": ("Collective",), "check_device_plans": ("Collective",),
    "reduce_local": ("DType", "RedOp"), "scale_copy": ("DType",), "divide_local": ("DType",),
}


@pytest.mark.parametrize("method, enums", [("run", ("Collective", "DType", "RedOp")), ("p2p", ("DType",)),
                                           ("recv_any", ("DType",)), ("auto_choice", ("Collective",))])
def test_host_bindings_take_enums_not_names(method, enums):
    sig = getattr(_C.Communicator, method).__doc__.splitlines()[0]
    for enum in enums:
        assert f"commlib._C.{enum}" in sig, sig


@pytest.mark.parametrize("name", sorted(ENUM_TAKING))
def test_bindings_take_enums_and_refuse_names(name):
    sig = getattr(_C, name).__doc__.splitlines()[0]
    for enum in ENUM_TAKING[name]:
        assert f"commlib._C.{enum}" in sig, sig
    assert "str" not in re.findall(r"(?:collective|dtype|op): ([\w.]+)", sig), sig


def test_a_name_given_to_a_binding_is_a_type_error_not_a_parse():
    with pytest.raises(TypeError):
        _C.algorithms("all_reduce")
    assert _C.algorithms(_C.Collective.all_reduce) == commlib.algorithms("all_reduce", one_sided=True)


@pytest.mark.parametrize("call, arg", [
    (lambda: commlib.schedule("allreduce", "ring", 0, 2, 4), "collective"),
    (lambda: commlib.schedule("all_reduce", "ring", 0, 2, 4, dtype="complex64"), "dtype"),
    (lambda: commlib.verify("all_reduce", "ring", 2, 4, dtype="float128"), "dtype"),
    (lambda: commlib.algorithms("nope"), "collective"),
    (lambda: commlib.algorithm_info("nope"), "collective"),
    (lambda: commlib.register_algorithm("nope", "mine", lambda *a: []), "collective"),
    (lambda: tuning.install({"collectives": {"nope": {}}}), "collective"),
    (lambda: call_spec.op("mean"), "op"),
])
def test_a_bad_name_from_the_python_api_names_the_argument(call, arg):
    with pytest.raises(ValueError, match=rf"^{arg}: unknown value '\w+' \(expected one of: "):
        call()


def test_an_enum_passes_through_and_odd_values_are_value_errors():
    assert call_spec.collective(_C.Collective.barrier) is _C.Collective.barrier
    with pytest.raises(ValueError, match="^dtype: unknown value"):
        call_spec.dtype(["float32"])  # unhashable
    with pytest.raises(ValueError, match="^--collectives: unknown value 'x'"):
        call_spec.collective("x", "--collectives")

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
