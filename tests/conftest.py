"""Shared fixtures: rank pools (commlib.testing) and the GPU marker's skip."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from commlib.testing import close_pools, get_pool  # noqa: E402


def _has_cuda():
    try:
        import commlib._C_cuda  # noqa: F401
        return True
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    # get_closest_marker, not `"gpu" in item.keywords`: keywords also hold the names of the
    # directories above the test, so a checkout in a folder named gpu skipped every test.
    if any(item.get_closest_marker("gpu") for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="no CUDA device")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    close_pools()


@pytest.fixture
def pool():
    """Call pool(n) to get the cached RankPool of n ranks."""
    return get_pool
