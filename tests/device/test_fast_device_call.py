"""The cached device all_reduce in C++ (issue #25, host cost; csrc/bindings/device_fast_call.cc):
a blocking in-place call that ran before is one C++ call from Communicator.all_reduce; a changed
stream, pointer or dtype misses and goes through the checked Python path (which fills the cache),
bad arguments after hits still raise naming the argument, async calls keep their works, results
stay exact. On the emulated device, in the rank pools of test_device_collectives.py."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fast_device_call_cases import bad_arguments_after_hits, hits_and_misses  # noqa: E402
from test_device_collectives import DELAY_ENV  # noqa: E402


def test_repeated_calls_hit_and_changed_keys_miss(pool):
    n = 5
    for out in pool(2, env=DELAY_ENV).run(hits_and_misses, n, timeout=60):
        assert out["repeated"] == (n - 1, True), out
        assert out["dtype"] == (0, True), out
        assert out["pointer"] == (0, True), out
        assert out["stream"] == ((0, 2, 1), True), out
        assert out["async"] == (0, True), out
        assert out["released"] == (2, True), out


def test_bad_arguments_after_hits_still_raise(pool):
    for errors, ok, cleared in pool(2, env=DELAY_ENV).run(bad_arguments_after_hits, timeout=60):
        assert ok and cleared, (ok, cleared, errors)
        assert all(hits == 0 for hits, _ in errors), errors
        op, scale, algorithm, premul, algorithm_type, op_type, async_algorithm = [e for _, e in errors]
        assert op and op.startswith("ValueError: op:") and "band" in op, op
        assert scale and scale.startswith("ValueError: scale:"), scale
        assert algorithm and algorithm.startswith("ValueError: algorithm:") and "no_such" in algorithm, algorithm
        assert premul and premul.startswith("ValueError: scale:"), premul
        assert algorithm_type and "algorithm" in algorithm_type, algorithm_type
        assert op_type and "op" in op_type, op_type
        assert async_algorithm and async_algorithm.startswith("ValueError: algorithm:"), async_algorithm


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
