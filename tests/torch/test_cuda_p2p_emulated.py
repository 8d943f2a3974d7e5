"""The torch backend's point-to-point on device arrays (rank side: torch_p2p_cases.py), on the
emulated device with its delay on, several ranks sharing it: receive-first rings at every count,
an array produced on a side stream, several messages per pair mixed with host tensors, a batch
issued by a later collective, refusals, and a mismatched pair. The same code path takes CUDA
tensors; tests/torch/test_cuda_backend.py has the GPU tests (skipped without a GPU). Also the C++
backend's CUDA entry (native_device_cases.py), driven with emulated memory through its test seam."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

pytest.importorskip("torch")

import native_device_cases  # noqa: E402
import torch_p2p_cases as cases  # noqa: E402

from emulated_pools import DELAY_ENV as ENV  # noqa: E402  (the device matrix's pools)


@pytest.mark.parametrize("size", [2, 3])
def test_receive_first_ring(pool, size):
    assert pool(size, env=ENV).run(cases.ring_receive_first) == [[]] * size


def test_side_stream_producer_and_waiter(pool):
    assert pool(2, env=ENV).run(cases.side_stream_producer) == [[]] * 2


@pytest.mark.parametrize("size", [2, 3])
def test_several_per_pair_mixed_with_host(pool, size):
    assert pool(size, env=ENV).run(cases.several_per_pair_and_mixed) == [[]] * size


def test_refusals_name_the_argument(pool):
    assert pool(2, env=ENV).run(cases.refusals) == [[]] * 2


@pytest.mark.timeout(60)
def test_mismatched_sizes_raise_on_both(pool):
    (k0, m0), (k1, m1) = pool(2, env=ENV).run(cases.mismatched_sizes, timeout=40)
    assert k1 == "MismatchError" and "40 x uint8" in m1 and "44 x uint8" in m1, (k1, m1)
    assert k0 == "MismatchError", (k0, m0)


@pytest.mark.timeout(60)
def test_an_unreported_mismatch_is_raised_and_logged_at_shutdown(pool):
    # Nobody waits for the mismatched receive: shutdown() raises its MismatchError and logs it (and
    # a process exiting with such an error logged exits with status 1: commlib/torch/at_exit.py).
    (_, e0, _), (unchanged, e1, logged) = pool(2, env=ENV).run(cases.unreported_at_shutdown, timeout=40)
    assert unchanged, "the mismatched receive wrote into its buffer"
    assert e1 == "MismatchError", e1
    assert any("no call reported it" in line and "MismatchError" in line for line in logged), logged
    assert e0 in (None, "MismatchError", "PeerError"), e0  # the sender checks nothing itself


def test_the_cpp_backend_runs_cached_device_calls_itself(pool):
    # The C++ backend's CUDA path: the first call sets the engine up from C++ and runs there; the
    # Python path adopts that engine; its calls then run from C++ through the core's table and the
    # communicator's device call cache.
    from commlib.torch import native
    if native.load() is None:
        pytest.skip("commlib._C_torch was not built")
    assert pool(2, env=ENV).run(native_device_cases.cached_calls_run_from_cpp) == [[]] * 2


def test_the_cpp_backends_steady_device_calls_cost_what_the_entrys_do(pool):
    # Its works are pooled and re-armed (bindings/device_work_pool.h, NativeWorkPool; and the
    # backend's CudaWork, torch_backend/device_calls.h DeviceCalls::work_for): no DeviceWork
    # made per steady call (one per call when every call made its own), and the per-call queues
    # (common/ring_queue.h) do not grow: the cases run one call in flight at a time, so the counts
    # do not depend on how far the host runs ahead of the emulated device (CI's machine: further). Its
    # driver calls are the Python entry's budget (tests/stream/test_call_counts.py PER_CALL: one
    # launch, one device guard, one capture query), plus one event record per launch exactly when
    # another engine lives on the device (stream/kernel_occupancy.h LaunchChain). A pool of its own: other modules' engines on the shared pools'
    # devices made these counts depend on module order (as test_call_counts.py's, which own theirs).
    # Counted again (twice at most) while a count allocated: see the case's docstring and comments.
    from commlib.torch import native
    if native.load() is None:
        pytest.skip("commlib._C_torch was not built")
    n = 200
    per_call = {"the kernel path's launch": 1, "cudaGetDevice": 1, "cudaStreamGetCaptureInfo": 1}
    for allocs, hits, right, calls, (torch_allocs, ran, pooled) in pool(2, env=ENV, own="native_counting").run(
            native_device_cases.steady_cpp_calls_allocate_nothing, n, timeout=120):
        assert right and hits == n, (hits, right)
        assert allocs == 0, allocs
        # _C_torch's side: a CudaWork re-armed from the backend's pool once torch let go of it, the
        # held tensors in a ring's slots (n per call each when made per call); 8 held + 1 in hand
        assert ran == n and torch_allocs == 0, (ran, torch_allocs)
        assert pooled <= 9, pooled
        assert calls.pop("cudaEventRecord", 0) in (0, n), calls
        assert calls == {k: v * n for k, v in per_call.items()}, calls


def test_the_cpp_backend_runs_device_sends_and_receives_itself(pool):
    # CUDA sends and receives on the C++ backend: held back and batched in C++, enqueued through
    # the core's table on any stream of an engine the device route set up; so are an uneven
    # all_to_all_single, gather, scatter and the list all_to_all (one batch each).
    from commlib.torch import native
    if native.load() is None:
        pytest.skip("commlib._C_torch was not built")
    assert pool(2, env=ENV).run(native_device_cases.cpp_sends_and_receives) == [[]] * 2


@pytest.mark.timeout(60)
def test_a_flush_holding_the_gil_lets_it_go_for_one_waiting_on_it(pool):
    # The lock order of the C++ hold is its mutex, then the GIL: a GIL-holding thread flushing
    # while a first CUDA batch holds the mutex and waits for the GIL must not deadlock (the flush,
    # the first device call, then sets the engine up from C++ under the mutex and runs the ring).
    from commlib.torch import native
    if native.load() is None:
        pytest.skip("commlib._C_torch was not built")
    for seen, holder_done in pool(2, env=ENV).run(native_device_cases.held_flush_lets_the_gil_go, timeout=40):
        assert holder_done and seen == "", seen


@pytest.mark.timeout(90)
def test_a_device_fault_raises_through_the_cpp_entry(pool):
    from commlib.torch import native
    if native.load() is None:
        pytest.skip("commlib._C_torch was not built")
    seen = pool(2, env=ENV).run(native_device_cases.device_fault_raises_through_cpp, timeout=60)
    assert seen[0] is None
    kind, message = seen[1]
    assert kind == "CommError" and "rank 1" in message, seen[1]
