"""Argument checks shared by the communicator's methods: each names the argument at fault and runs
before anything is sent (commlib/core/communicator.py calls them; commlib/core/p2p_plan.py too)."""
from __future__ import annotations

import datetime
import math
import numbers
import operator
from typing import Optional

import numpy as np

import commlib._C as _C
from commlib.core.call_spec import COLLECTIVE
from commlib.device.host_buffers import describe
from commlib.device.buffers import device_buffer
from commlib.device.dtypes import FLOATS as _FLOAT_DTYPES

_BITWISE_OPS = frozenset(("band", "bor", "bxor"))
_OPS = frozenset(_C.OPS)
# Registered names, refreshed on a miss: commlib.register_algorithm may add some at run time.
_ALGORITHMS = {c: frozenset(_C.algorithms(COLLECTIVE[c])) for c in _C.COLLECTIVES if c not in ("send", "recv")}
# One-sided built-ins (schedules over peers' mapped buffers): listed and verified, not run by any engine.
_ONE_SIDED = {c: frozenset(a["name"] for a in _C.algorithm_info(COLLECTIVE[c]) if "one_sided" in a["traits"])
              for c in _ALGORITHMS}


def check_op(op: str, dtype: str, scale):
    if op not in _OPS:
        raise ValueError(f"op: unknown reduction '{op}' (expected one of: {', '.join(_C.OPS)})")
    if op in _BITWISE_OPS and dtype in _FLOAT_DTYPES:
        raise ValueError(f"op: bitwise reduction '{op}' is defined for integer dtypes only, not {dtype}")
    if op == "premul_sum":
        if scale is None:
            raise ValueError("scale: op='premul_sum' needs a scale factor")
        # A number (or a 0-d array / tensor that converts to one), never text: float("2") would
        # quietly accept a string.
        if isinstance(scale, (str, bytes, bytearray)):
            raise TypeError(f"scale: expected a number, got {type(scale).__name__} {scale!r}")
        try:
            return float(scale)
        except (TypeError, ValueError) as e:
            raise TypeError(f"scale: expected a number, got {type(scale).__name__}") from e
    if scale is not None:
        raise ValueError(f"scale: only op='premul_sum' takes a scale (op is '{op}')")
    return 1.0


def describe_like(x, name: str, dtype: str, other: str, count: int, expected: str):
    """Pointer of ``x`` after checking it matches ``other``'s dtype and has ``count`` elements."""
    ptr, n, dt = describe(x, name)
    if dt != dtype:
        raise TypeError(f"{name}: dtype {dt} differs from {other}'s {dtype}")
    if n != count:
        raise ValueError(f"{name}: has {n} elements, expected {expected}")
    return ptr


def check_algorithm(collective: str, algorithm: str):
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm: expected a string, got {type(algorithm).__name__}")
    if algorithm == "nccl" and collective != "barrier":  # NCCL's own, on device buffers only (_run)
        return
    if algorithm != "auto" and algorithm not in _ALGORITHMS[collective]:
        _ALGORITHMS[collective] = frozenset(_C.algorithms(COLLECTIVE[collective]))
    if algorithm != "auto" and algorithm not in _ALGORITHMS[collective]:
        raise ValueError(f"algorithm: unknown {collective} algorithm '{algorithm}' "
                         f"(expected one of: auto, {', '.join(_C.algorithms(COLLECTIVE[collective]))})")


def check_one_sided_on_host(collective: str, algorithm: str, compress=None):
    """One-sided algorithms read and write peers' buffers in place: only the device kernel path runs
    them (docs/gpu.md, "One-sided plans"), not the host executor nor compressed calls."""
    if algorithm in _ONE_SIDED.get(collective, ()):
        where = "with compress=" if compress is not None else "on host buffers"
        raise ValueError(f"algorithm: {collective} algorithm '{algorithm}' is one-sided (it reads and writes "
                         f"peers' mapped buffers): it runs on device buffers on the kernel path only, not {where}")


# The argument names of each collective's buffers, in the order of _run's ``refs``.
_REF_NAMES = {"all_reduce": ("tensor", "out"), "reduce": ("tensor", "out"), "broadcast": ("tensor",)}


def device_buffers_of(coll, refs):
    """(argument name, DeviceBuffer) for the device buffers among a call's ``refs``."""
    return named_device_buffers(zip(_REF_NAMES.get(coll, ("input", "output")), refs))


def named_device_buffers(named):
    """(argument name, DeviceBuffer) for the device buffers among (name, buffer) pairs; raises if
    host and device buffers are mixed."""
    found, host = [], []
    for name, r in named:
        b = device_buffer(r, name)
        if b is not None:
            found.append((name, b))
        elif r is not None:
            host.append(name)
    if found and host:
        raise ValueError(f"{host[0]}: is host memory but {found[0][0]} is device memory; "
                         "a call's buffers must all be on one device")
    return found



def is_rank(x) -> bool:
    """An int that is not a bool: True is not rank 1."""
    return isinstance(x, int) and not isinstance(x, bool)


def as_int(x, name: str) -> int:
    """``x`` as a Python int: ints and integral scalars (``np.int64(1)``, anything with
    ``__index__``, as torch and MPI accept) pass; bools, floats and the rest are refused
    (ValueError "<name>: must be an int") before anything is sent."""
    if isinstance(x, (bool, np.bool_)):
        raise ValueError(f"{name}: must be an int, got the bool {x!r} (True is not rank 1)")
    if isinstance(x, int):
        return int(x)
    try:
        return operator.index(x)
    except TypeError:
        raise ValueError(f"{name}: must be an int, got {type(x).__name__} {x!r}") from None


def as_rank(x, name: str, size: int) -> int:
    """``x`` as a rank of a communicator of ``size`` ranks (see ``as_int``)."""
    r = as_int(x, name)
    if not 0 <= r < size:
        raise ValueError(f"{name}: {r} is out of range for a communicator of size {size}")
    return r


def as_ranks(xs, name: str, size: int) -> list:
    """``xs`` (any iterable) as a list of distinct ranks of a communicator of ``size`` (each as
    ``as_rank``: ``np.int64(2)`` passes); TypeError naming ``name`` if it is not iterable."""
    if isinstance(xs, (str, bytes)) or not hasattr(xs, "__iter__"):
        raise TypeError(f"{name}: expected a list of ranks, got {type(xs).__name__}")
    ranks = [as_rank(x, name, size) for x in xs]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"{name}: a rank appears twice in {ranks}")
    return ranks


def seconds_value(x, name: str = "timeout") -> float:
    """``x`` (seconds: an int, a float, a NumPy or torch scalar, or a ``datetime.timedelta``) as a
    float, unchecked for range; text, bools and other types are refused (TypeError naming
    ``name``), never converted (``float("5")`` would be)."""
    if isinstance(x, datetime.timedelta):
        return x.total_seconds()
    if isinstance(x, (bool, np.bool_)) or not (isinstance(x, numbers.Real) or hasattr(x, "__float__")):
        raise TypeError(f"{name}: expected seconds (a number or a timedelta), got {type(x).__name__} {x!r}")
    try:
        return float(x)
    except (TypeError, ValueError) as e:  # a tensor of several elements, say
        raise TypeError(f"{name}: expected seconds (a number or a timedelta), got {type(x).__name__}") from e


def as_seconds(x, name: str = "timeout", allow_zero: bool = False) -> Optional[float]:
    """``x`` as seconds (``seconds_value``); None stays None. Negative, NaN and infinite values
    and, unless ``allow_zero``, zero are refused (ValueError naming ``name``). Every call taking a
    timeout checks it here."""
    if x is None:
        return None
    value = seconds_value(x, name)
    if not (math.isfinite(value) and (value >= 0 if allow_zero else value > 0)):
        raise ValueError(f"{name}: must be a {'non-negative' if allow_zero else 'positive'}, finite number "
                         f"of seconds, got {x!r}")
    return value


def as_flag(x, name: str = "async_op") -> bool:
    """``x`` as a bool: True, False and NumPy's bools pass; anything else (a string, an int, None) is
    refused (TypeError naming ``name``) before anything is sent, never read as true or false by
    its truth value (``async_op="no"`` would run async)."""
    if x is True or x is False:
        return x
    if isinstance(x, np.bool_):
        return bool(x)
    raise TypeError(f"{name}: expected a bool (True or False), got {type(x).__name__} {x!r}")


def as_split_list(x, name: str):
    """``x`` (split sizes: a list, tuple or any iterable of ints, e.g. a NumPy array; None: equal
    blocks) as a list of Python ints, each read as ``as_int`` reads a rank (a bool, a float or text
    is refused, never converted: ``int("3")``, ``int(2.5)``, ``True``); TypeError naming ``name``
    for anything that is not iterable."""
    if x is None:
        return None
    if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
        raise TypeError(f"{name}: expected a list of element counts (one per rank), got {type(x).__name__} {x!r}")
    return [as_int(s, name) for s in x]


# The keyword arguments checked by their value alone, the same way for every method that takes
# them, whichever route runs the call: each method's Python route reads them through
# check_keywords before anything is sent (one table: communicator.py's collectives and barrier,
# comm_p2p.py's batches). The C++ entry (csrc/bindings/fast_call.cc) runs a call only when each is of
# the one plain form this table accepts too (async_op exactly True or False; splits a list or tuple
# of ints that are not bools: device_all_to_allv.cc read_splits) and declines anything else to that
# route, so a wrong value raises the same named error on either (tests/stream/test_keyword_errors.py).
KEYWORDS = {
    "async_op": as_flag,
    "output_splits": as_split_list,
    "input_splits": as_split_list,
}


def check_keywords(**given):
    """The values of ``given`` (keyword arguments of a call, by name) as KEYWORDS' checks read them,
    in the order given: a tuple, one value per argument; raises naming the first that is wrong."""
    return tuple(KEYWORDS[name](value, name) for name, value in given.items())


def split_sizes(splits, total, P, name):
    if splits is None:
        if total % P:
            raise ValueError(f"{name}: {total} elements do not split evenly over {P} ranks")
        return [total // P] * P
    splits = as_split_list(splits, name)
    if len(splits) != P:
        raise ValueError(f"{name}: has {len(splits)} entries, expected one per rank ({P})")
    if any(s < 0 for s in splits):
        raise ValueError(f"{name}: negative split size")
    if sum(splits) != total:
        raise ValueError(f"{name}: sums to {sum(splits)} but the tensor has {total} elements")
    return splits
