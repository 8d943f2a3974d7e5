"""The C++ backend's CUDA path on calls of a new shape (csrc/bindings/device_call_new_shape.cc) and on
new streams (csrc/bindings/device_p2p_streams.h): once the engine is set up (the first call on a
group and device, from C++ too: csrc/bindings/device_engines.h), calls whose buffers, count, dtype, op, root or stream are new
run from C++ (rank side:
native_new_shape_cases.py, driven with emulated memory through the backend's test seam), on the
emulated device with its delay on and several ranks sharing it. The GPU version of the fresh-buffer
loop is tests/torch/torch_cuda_cases.py's case_cuda_fresh_tensors_from_cpp (@gpu)."""
import pytest

pytest.importorskip("torch")

import native_new_shape_cases as cases  # noqa: E402

from emulated_pools import DELAY_ENV as ENV  # noqa: E402  (the device matrix's pools)


pytestmark = pytest.mark.usefixtures("cpp_backend")  # (tests/torch/conftest.py)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [2, 3])
def test_fresh_buffers_of_every_collective_run_from_cpp_after_set_up(pool, size):
    for rank, (python_calls, calls, new, hits, repeats_new, wrong) in enumerate(
            pool(size, env=ENV).run(cases.fresh_buffers_run_from_cpp, timeout=150)):
        # The Python route saw nothing, not even the set-up (the first call set the engine up from
        # C++): every later call, each a new shape, ran from C++.
        assert python_calls == [], (rank, python_calls)
        assert calls == 6 * 7 and new == calls and hits == calls, (rank, calls, new, hits)
        assert repeats_new == 0, (rank, repeats_new)  # the same call again hits the entry kept
        assert wrong == [], (rank, wrong)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("size", [2, 3])
def test_a_bad_argument_of_a_new_shape_is_declined_and_named(pool, size):
    for rank, (seam, errors, counted, right) in enumerate(
            pool(size, env=ENV).run(cases.bad_arguments_name_themselves, timeout=60)):
        assert seam == [True, True], (rank, seam)  # declined by C++: nothing ran
        assert errors[0].startswith("ValueError: root:"), (rank, errors)
        assert errors[1].startswith("ValueError: op:") and "band" in errors[1], (rank, errors)
        assert counted == 0 and right, (rank, counted, right)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("size,late", [(2, None), (3, None), (3, 2)])
def test_a_mismatched_new_shape_raises_mismatch_error_on_every_rank(pool, size, late):
    # late: that rank calls a second after the others, who have found the mismatch and failed its
    # engine by then; it raises from the C++ entry (the engine refuses the call).
    for rank, (from_cpp, seen) in enumerate(
            pool(size, env=ENV).run(cases.mismatched_new_shapes, late, timeout=60)):
        assert from_cpp, (rank, seen)
        assert seen.startswith("MismatchError"), (rank, seen)


@pytest.mark.timeout(120)
def test_new_shapes_from_cpp_keep_the_capture_rules(pool):
    # The side stream was never used before its capture: C++ wraps it (a capture is no reason to
    # hand a call over) and the engine refuses the capture naming the warm-up, as on the Python path.
    for rank, (refused, python_calls, wrapped, right) in enumerate(
            pool(2, env=ENV).run(cases.captured_new_shapes, timeout=90)):
        assert refused.startswith("CommError") and "warm-up" in refused, (rank, refused)
        assert python_calls == [], (rank, python_calls)  # (the set-up from C++ too)
        assert wrapped == 1 and right, (rank, wrapped, right)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [2, 3])
def test_calls_on_new_streams_run_from_cpp_after_set_up(pool, size):
    # The first call on a group and device sets the engine up (from C++ too); calls on three
    # streams no call ran on before (and the default one, in turn) run from C++, each stream wrapped
    # in C++ once, exactly.
    for rank, (python_calls, calls, hits, wrapped, wrong) in enumerate(
            pool(size, env=ENV).run(cases.new_streams_run_from_cpp, timeout=150)):
        assert python_calls == [], (rank, python_calls)
        assert calls == 4 * 3 * 7 and hits == calls, (rank, calls, hits)
        assert wrapped == 3, (rank, wrapped)
        assert wrong == [], (rank, wrong)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("size", [2, 3])
def test_sends_and_receives_on_a_new_stream_run_from_cpp(pool, size):
    # The set-up was a collective on the default stream; a ring on a stream no call ran on goes out
    # as one engine batch from C++ (the stream wrapped there), never through Communicator.batch_p2p.
    for rank, (python_calls, python_batches, batches, wrapped, right) in enumerate(
            pool(size, env=ENV).run(cases.p2p_on_a_new_stream, timeout=60)):
        assert python_calls == [] and python_batches == 0, (rank, python_calls, python_batches)
        assert batches == 1 and wrapped == 1 and right, (rank, batches, wrapped, right)


@pytest.mark.timeout(90)
def test_a_stream_set_up_by_a_batch_serves_new_collectives_from_cpp(pool):
    for rank, (python_calls, batches, new, right) in enumerate(
            pool(2, env=ENV).run(cases.stream_set_up_by_a_batch, timeout=60)):
        assert python_calls == [] and batches == 1, (rank, python_calls, batches)
        assert new == 1 and right, (rank, new, right)


@pytest.mark.timeout(120)
def test_a_new_shape_costs_the_device_calls_of_a_hit(pool):
    # The per-shape work moved into C++ (checks, StreamEngine::prepare) is the host's: a new shape
    # makes the driver calls a steady hit makes (test_cuda_p2p_emulated.py's budget: one launch, one
    # device guard, one capture query; one event record per launch exactly when another engine lives
    # on the device). A pool of its own, as that test's, so no other engine is on its device.
    n = 100
    per_call = {"the kernel path's launch": 1, "cudaGetDevice": 1, "cudaStreamGetCaptureInfo": 1}
    for calls, new, right in pool(2, env=ENV, own="native_new_shapes").run(
            cases.new_shapes_cost_what_hits_do, n, timeout=90):
        assert new == n and right, (new, right)
        assert calls.pop("cudaEventRecord", 0) in (0, n), calls
        assert calls == {k: v * n for k, v in per_call.items()}, calls
