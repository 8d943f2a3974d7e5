"""Device calls on a stream the caller names, through the C++ entry (issue #37, items 1 and 2):
``stream=`` read in C++ as the device route's resolver reads it (csrc/bindings/named_stream.cc)
and a ``__cuda_array_interface__``'s own ``stream`` (version 3: the data is valid there, so the call
runs there, as the route's resolver of that buffer does), blocking and async, new shapes and
repeated calls, every collective (gather's and scatter's first calls too): the Python route
(DeviceRoute.run, spied on) sees none of them once the engine is set up; results exact at 2 and 3 ranks; the call waits for work the interface's stream had
enqueued; a wrong stream= type raises the resolver's TypeError naming ``stream`` with nothing
enqueued. On the emulated device, in the rank pools of test_device_collectives.py; the driver-call
counts of such steady calls are test_call_counts.py's."""
import os
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from entry_stream_cases import (a_dropped_named_stream_is_never_aliased, interface_stream_orders_the_call,  # noqa: E402
                                interface_streams_of_no_use, named_and_own_stream_calls, wrong_stream_types)
from test_device_collectives import DELAY_ENV  # noqa: E402


@pytest.mark.parametrize("P", [2, 3])
def test_calls_on_a_named_or_the_interfaces_stream_never_reach_the_python_route(pool, P):
    k = 2
    for out in pool(P, env=DELAY_ENV).run(named_and_own_stream_calls, k, timeout=120):
        assert sorted(out) == ["interface's stream", "stream="], out
        for case, (python_calls, hits, made, waits_ok, right) in out.items():
            # Eight collectives, blocking and async, k + 1 calls each: all from C++ (gather's and
            # scatter's first calls too, whose buffers differ per rank: the root's whole buffer).
            assert made == 8 * 2 * (k + 1), (case, made)
            assert (python_calls, hits, waits_ok, right) == (0, made, True, True), (case, out[case])


@pytest.mark.parametrize("P", [2, 3])
def test_the_interfaces_stream_orders_the_call_after_its_work(pool, P):
    for rights, python_calls in pool(P, env=DELAY_ENV).run(interface_stream_orders_the_call, timeout=120):
        assert rights == [True, True] and python_calls == 0, (rights, python_calls)


def test_a_stream_the_caller_dropped_is_held_by_its_entries_and_never_aliased(pool):
    # (issue #37: entries key a stream by its identity; on the emulated device the wrapper is the
    # stream, so the cache holds it alive; on CUDA the wrapper is the handle alone: docs/gpu.md)
    for alive, aliased, right, python_calls in pool(2, env=DELAY_ENV).run(a_dropped_named_stream_is_never_aliased,
                                                                          timeout=60):
        assert (alive, aliased, right, python_calls) == (True, False, True, 0), (alive, aliased, right, python_calls)


def test_a_wrong_stream_type_raises_naming_stream_before_anything_is_enqueued(pool):
    for out in pool(2, env=DELAY_ENV).run(wrong_stream_types, timeout=60):
        for type_name, error, python_calls, calls in out:
            assert error == f"stream: expected a commlib.emulated.Stream, got {type_name}", (type_name, error)
            assert python_calls == 0 and calls == {}, (type_name, python_calls, calls)


def test_an_interface_naming_no_live_stream_of_its_device_raises_naming_the_argument(pool):
    for out in pool(2, env=DELAY_ENV).run(interface_streams_of_no_use, timeout=60):
        assert [case for case, *_ in out] == ["gone", "another device"], out
        for case, error, python_calls, calls in out:
            assert error and error.startswith("tensor: __cuda_array_interface__'s stream 0x"), (case, error)
            assert error.endswith("is no live stream of emulated:0"), (case, error)
            # (what the readers asked: the interface's pointer, in C++ and again on the Python path)
            assert python_calls == 0 and set(calls) <= {"cuPointerGetAttributes"}, (case, python_calls, calls)


def test_cuda_streams_are_read_as_the_routes_resolver_reads_them():
    # torch.cuda.Stream (cuda_stream), CuPy streams (ptr), ints: the stream's cudaStream_t, which
    # the entry keys the call on (a new int object each call still hits); anything else the
    # resolver's TypeError, the same words; what the resolver would look at further (a negative
    # handle, an attribute that is no int) is left to it (None).
    import commlib._C as _C
    from commlib.core import device_route
    from commlib.device.buffers import DeviceBuffer
    torch_like = types.SimpleNamespace(cuda_stream=0x5150)
    cupy_like = types.SimpleNamespace(ptr=0x6160)
    assert _C.read_named_stream("cuda", torch_like) == 0x5150
    assert _C.read_named_stream("cuda", cupy_like) == 0x6160
    assert _C.read_named_stream("cuda", types.SimpleNamespace(cuda_stream=1, ptr=2)) == 1  # the resolver's order
    assert _C.read_named_stream("cuda", 2**40 + 3) == 2**40 + 3 and _C.read_named_stream("cuda", True) == 1
    assert _C.read_named_stream("cuda", -1) is None
    assert _C.read_named_stream("cuda", types.SimpleNamespace(ptr="x")) is None
    try:
        resolve = device_route.stream_resolver(DeviceBuffer("cuda", 0, 0, "float32", 0))
    except RuntimeError:  # no usable commlib._C_cuda here: the resolver's words as they stand in it
        resolve = None
    for bad in ("s", 1.5, object()):
        with pytest.raises(TypeError) as cpp:
            _C.read_named_stream("cuda", bad)
        assert str(cpp.value) == ("stream: expected a torch.cuda.Stream, CuPy stream or cudaStream_t, got "
                                  f"{type(bad).__name__}"), cpp.value
        if resolve is not None:
            with pytest.raises(TypeError) as py:
                resolve(bad)
            assert str(py.value) == str(cpp.value)
    import commlib.emulated as emu
    s = emu.Stream()
    assert _C.read_named_stream("emulated", s) == s.handle == _C.stream_identity(s._stream) != 0
    with pytest.raises(TypeError, match="^stream: expected a commlib.emulated.Stream, got int$"):
        _C.read_named_stream("emulated", s.handle)
