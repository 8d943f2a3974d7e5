"""Shared fixtures: rank pools (commlib.testing) and the GPU marker's skip."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from commlib.testing import close_pools, get_pool  # noqa: E402


from gpu_presence import cuda_import_error, gpu_verdict, listed_gpus  # noqa: E402
from thread_leaks import describe, left_running, retire_pools_with_dead_stores  # noqa: E402
from module_order import ModuleClock, keep_collection_order, longest_modules_first  # noqa: E402

_module_clock = ModuleClock()  # (each module's seconds in this run: build/module_seconds.txt)


def pytest_configure(config):
    keep_collection_order(config)


def pytest_runtest_logreport(report):
    _module_clock.add(report)


def pytest_collection_modifyitems(config, items):
    longest_modules_first(items)
    # get_closest_marker, not `"gpu" in item.keywords`: keywords also hold the names of the
    # directories above the test, so a checkout in a folder named gpu skipped every test.
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    verdict, reason = gpu_verdict(listed_gpus(), cuda_import_error())
    if verdict == "run":
        return
    # A GPU that nvidia-smi lists but commlib cannot use fails every GPU test with the reason
    # (issue #23, item 4); without a GPU they skip.
    mark = pytest.mark.skip(reason=reason) if verdict == "skip" else pytest.mark.usefixtures("_unusable_gpu")
    config._commlib_gpu_failure = reason
    for item in gpu_items:
        item.add_marker(mark)


@pytest.fixture(autouse=True)
def _gpu_test_starts_with_no_pool(request):
    """A @gpu test (it runs only where a real GPU is) starts with every cached pool closed. The
    kernel path claims its grid in a ledger every process on the GPU shares (csrc/stream/grid_claims.h):
    the first communicator of other processes on the device takes its whole share, so a pool left
    from an earlier test (another world size, another module) left the next one no blocks, and its
    calls took the copy path or refused, and a pool's call cache held another test's calls (session
    31, the first run of these tests on a GPU with pools cached: most of the 23 failures of 55). The
    emulated device has no such limit unless a test sets one, so CI's pools stay cached."""
    if request.node.get_closest_marker("gpu"):
        close_pools()
    yield


@pytest.fixture
def _unusable_gpu(request):
    pytest.fail(request.config._commlib_gpu_failure, pytrace=False)


def pytest_report_header(config):
    n = listed_gpus()
    return f"GPUs listed by nvidia-smi: {n}" + ("" if n == 0 else f"; commlib._C_cuda: {cuda_import_error() or 'usable'}")


def pytest_sessionfinish(session, exitstatus):
    close_pools()
    if not hasattr(session.config, "workerinput"):  # (the xdist controller, or a run without workers)
        _module_clock.write()


@pytest.fixture
def pool():
    """Call pool(n) to get the cached RankPool of n ranks."""
    return get_pool


def _fail_if_left(before, what):
    left = left_running(before)
    if left:
        pytest.fail(f"threads still running after the {what}: {describe(left)}: close the store, "
                    "communicator or pool it started (tests/thread_leaks.py)", pytrace=False)
    dead = retire_pools_with_dead_stores()
    if dead:
        pytest.fail(f"{', '.join(dead)} store thread died during the {what} (did it patch a module every "
                    "thread shares, e.g. time?): tests/thread_leaks.py", pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def _no_threads_left_by_the_module():
    """The same at the module's end: what its module-scoped fixtures started (set up after this one,
    torn down before it) must be gone too."""
    import threading
    before = threading.enumerate()
    yield
    _fail_if_left(before, "module")


@pytest.fixture(autouse=True)
def _no_leaked_threads():
    """Fail a test that leaves a store server (or any commlib-named or non-daemon) thread running:
    it would meet the next tests' patches in this worker (tests/thread_leaks.py)."""
    import threading
    before = threading.enumerate()
    yield
    _fail_if_left(before, "test")
