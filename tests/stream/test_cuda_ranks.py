"""The stream engine on a real GPU (``@pytest.mark.gpu``: skipped without one; several ranks on
GPU 0, torch CUDA tensors): the collective matrix's covering cases at 2 and 4 ranks, and the
pipeline's two lanes (device_lanes_cases.py) as first device calls and after a collective. Run by
scripts/gpu_check.sh, with and without MPS."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_cases  # noqa: E402
import device_cuda_cases  # noqa: E402
import device_lanes_cases as lanes  # noqa: E402
import entry_stream_cases  # noqa: E402
import fast_device_call_cases  # noqa: E402
from test_device_collectives import covering_cases  # noqa: E402

# Short: a hang must show as an error within the GPU check's step, not eat it.
ENV = {"COMMLIB_TIMEOUT": "20"}


@pytest.mark.gpu
@pytest.mark.timeout(150)
@pytest.mark.parametrize("size", [2, 4])
def test_covering_collectives_on_cuda(pool, size):
    pytest.importorskip("torch")
    results = pool(size, env=ENV).run(device_cuda_cases.check_cases, covering_cases(size), timeout=120)
    device_cases.check_results(results)


@pytest.mark.gpu
@pytest.mark.timeout(90)
@pytest.mark.parametrize("size,warm", [(2, False), (4, False), (4, True)])
def test_two_lane_pipeline_on_cuda(pool, size, warm):
    pytest.importorskip("torch")
    assert pool(size, env=ENV).run(lanes.two_lanes, "cuda", warm=warm, timeout=60) == [[]] * size


@pytest.mark.gpu
@pytest.mark.timeout(90)
def test_cached_all_reduce_reads_torch_cuda_tensors(pool):
    """The C++ entry's torch CUDA reader (csrc/bindings/buffer_view.cc): repeated calls hit,
    another torch stream runs from C++ too (wrapped in C++, a new shape), a bad argument after hits
    still raises naming it."""
    pytest.importorskip("torch")
    for hits, error, ok in pool(2, env=ENV).run(fast_device_call_cases.cuda_hits, timeout=60):
        assert ok and hits == (3, 1, 2, 0), hits
        assert error and error.startswith("algorithm:") and "no_such" in error, error


@pytest.mark.gpu
@pytest.mark.timeout(90)
def test_calls_on_named_and_interface_streams_run_from_cpp(pool):
    """stream= as a new torch.cuda.ExternalStream each call or an int cudaStream_t, and a
    __cuda_array_interface__ naming the stream, read in C++ (csrc/bindings/named_stream.cc,
    foreign_arrays.cc): never the Python route once the engine is set up; results exact."""
    pytest.importorskip("torch")
    for python_calls, all_hits, ok in pool(2, env=ENV).run(entry_stream_cases.cuda_named_and_own_streams,
                                                             timeout=60):
        assert (python_calls, all_hits, ok) == (0, True, True), (python_calls, all_hits, ok)
