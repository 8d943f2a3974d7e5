"""The C++ entry's device calls (issue #37; csrc/bindings/fast_call.cc, device_call_cache.h): a device
collective that ran before is one C++ call from Communicator, for every collective, blocking or
async (the work handle comes back from C++), on the current stream or a named one; a changed
stream, pointer or dtype misses and goes through the checked Python path (which fills the cache);
bad arguments after hits still raise naming the argument; results stay exact. On the emulated
device, in the rank pools of test_device_collectives.py."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fast_device_call_cases import (bad_arguments_after_hits, compressed_calls_hit, every_collective_hits,  # noqa: E402
                                   every_collective_misses, hits_and_misses)
from test_device_collectives import DELAY_ENV  # noqa: E402


def test_repeated_calls_hit_and_changed_keys_miss(pool):
    n = 5
    for out in pool(2, env=DELAY_ENV).run(hits_and_misses, n, timeout=60):
        assert out["repeated"] == (n - 1, True), out
        # Another dtype, another pointer, another stream: new shapes the C++ entry runs itself.
        assert out["dtype"] == (1, True), out
        assert out["pointer"] == (1, True), out
        assert out["stream"] == ((1, 2, 1), True), out
        assert out["async"] == (2, True), out
        assert out["async new shape"] == (1, True), out
        assert out["released"] == (2, True), out
        # dtype, y's first call, the slice, ints' first call, ints' on the other stream, the async
        # one, w's second.
        assert out["new_shapes"] == 7, out


def test_every_collective_hits_blocking_async_and_on_a_named_stream(pool):
    k = 3
    for out in pool(2, env=DELAY_ENV).run(every_collective_hits, k, timeout=60):
        assert sorted(out) == sorted(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                      "reduce", "gather", "scatter"]), out
        for name, (hits, works_ok, ok) in out.items():
            # Misses: the first call for all_reduce (the engine's set-up); every other call ran
            # from C++, gather's and scatter's first and the named stream's first included (read
            # in C++: csrc/bindings/named_stream.cc).
            assert (hits, works_ok, ok) == (3 * k + 2 - every_collective_misses(name), True, True), (name, out[name])


def test_bad_arguments_after_hits_still_raise(pool):
    for errors, ok, cleared in pool(2, env=DELAY_ENV).run(bad_arguments_after_hits, timeout=60):
        assert ok and cleared, (ok, cleared, errors)
        for label, hits, error, start in errors:
            assert hits == 0, (label, hits, error)
            assert error and error.startswith(start), (label, error, start)
        by_label = {label: error for label, _, error, _ in errors}
        assert "band" in by_label["op"] and "no_such" in by_label["unknown algorithm"], by_label


def test_use_stream_mirrors_the_current_stream_for_cpp():
    import commlib._C as _C
    import commlib.emulated as emu
    a, b = emu.Stream(), emu.Stream()
    assert _C.emulated_current_stream() == 0
    with emu.use_stream(a):
        top_a = _C.emulated_current_stream()
        try:
            with emu.use_stream(b):
                assert _C.emulated_current_stream() not in (0, top_a)
                raise KeyError("leave by an exception")
        except KeyError:
            pass
        assert _C.emulated_current_stream() == top_a != 0
    assert _C.emulated_current_stream() == 0


def test_one_reader_sees_host_and_device_buffers():
    # csrc/bindings/buffer_view.h: the tagged view the C++ entry reads every buffer into, for host
    # and device calls alike (kind, address, count, dtype, device, current stream); None where it
    # cannot read the object (the Python path then takes the call and explains).
    import numpy as np

    import commlib._C as _C
    import commlib.emulated as emu
    a = np.arange(3, dtype=np.float32)
    assert _C.read_buffer(a) == ("host", a.ctypes.data, 3, _C.DType.float32, -1, 0)
    x = emu.from_numpy(np.ones(5, np.int64))
    assert _C.read_buffer(x) == ("emulated", x.data_ptr(), 5, _C.DType.int64, x.device_index, 0)
    assert _C.read_buffer(x[2:]) == ("emulated", x.data_ptr() + 16, 3, _C.DType.int64, x.device_index, 0)
    s = emu.Stream()
    with emu.use_stream(s):
        assert _C.read_buffer(x)[5] == _C.emulated_current_stream() != 0
    assert _C.read_buffer(None)[0] == "none"
    for unreadable in (a[::2], a.astype(np.complex64), [1.0, 2.0], np.ndarray.view(a, type=np.matrix)):
        assert _C.read_buffer(unreadable) is None, unreadable


def test_compressed_calls_hit_after_the_first(pool):
    """compress= (a codec's name or a Codec, held by the entry: its identity is part of the key): the
    first call of each shape takes the Python route (the codec is checked, and auto resolved under the
    verifier, in Python: core/codecs.py), every later one runs from C++ with the codec and algorithm
    it resolved, bitwise the first call's result."""
    n = 3
    for out in pool(2, env=DELAY_ENV).run(compressed_calls_hit, n, timeout=120):
        assert len(out) == 6, out
        for case, (python_calls, hits, same, close) in out.items():
            assert (python_calls, hits, same, close) == (1, n, True, True), (case, out[case])
