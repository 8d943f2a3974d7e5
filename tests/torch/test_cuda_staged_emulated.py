"""The C++ backend's staged CUDA calls (csrc/torch_backend/staging.h, device_staged.cc) on the emulated
device with its delay on, several ranks on one device: non-contiguous, cast, conjugate and list
forms (uneven all_gather lists too), equal-block all_to_all_single, expanded inputs and a
reduce_scatter list that needs a cast (session 27), staged by the CPU path's own
builders, run on the device entry, copied back after the call (rank side:
native_staged_device_cases.py, through the backend's test seam ``_staged_device_call``).
The GPU version against gloo is tests/torch/torch_cuda_staged_cases.py (@gpu)."""
import pytest

pytest.importorskip("torch")

import native_staged_device_cases as cases  # noqa: E402

from emulated_pools import DELAY_ENV as ENV  # noqa: E402  (the device matrix's pools)


pytestmark = pytest.mark.usefixtures("cpp_backend")  # (tests/torch/conftest.py)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [2, 3])
def test_staged_calls_run_from_cpp_on_device_memory(pool, size):
    for rank, (bad, python_calls, new, calls) in enumerate(
            pool(size, env=ENV).run(cases.staged_calls_run_from_cpp, timeout=150)):
        assert bad == [], (rank, bad)
        # The Python route saw nothing, not even the set-up call (from C++); every staged call ran
        # from C++ (a new shape each).
        assert python_calls == [], (rank, python_calls)
        assert calls == 24 and new == calls, (rank, calls, new)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("size", [2, 3])
def test_a_staged_call_with_a_bad_argument_stages_nothing(pool, size):
    for rank, (seam, error, made, counted, right) in enumerate(
            pool(size, env=ENV).run(cases.staged_bad_arguments, timeout=60)):
        # declined by the builders, raised by the backend as the Python backend words them
        assert seam == [f"ValueError: root: {size} is out of range for a communicator of size {size}",
                        "TypeError: output: dtype torch.int16 differs from input's torch.float32",
                        f"ValueError: output: {3 * size + 1} elements do not split over {size} ranks "
                        "(give output_split_sizes)",
                        "TypeError: output: dtype torch.float32 differs from input's torch.int16",
                        f"ValueError: output_tensor_list[{rank}]: has {rank + 1} elements, input has {rank + 2}",
                        "TypeError: output_tensor_list: dtypes differ from the input's"], (rank, seam)
        assert error.startswith("ValueError: op: max") and "complex" in error, (rank, error)
        assert made == 0 and counted == 0, (rank, made, counted)  # nothing staged, nothing enqueued
        assert right, rank


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [2, 3])
def test_the_gpu_staged_case_passes_on_cpu_tensors(pool, size):
    # The @gpu case (test_cuda_backend.py's test_cuda_staged_calls_equal_gloo) on CPU tensors: its
    # comparisons with gloo and its spy on the Python backend, through the same staging builders.
    import torch_cuda_staged_cases
    fails = [f for r in pool(size).run(torch_cuda_staged_cases.case_cuda_staged, "cpu", timeout=150) for f in r]
    assert fails == [], "\n".join(fails[:20])
