"""The stream engine's own semantics across ranks: stream order and works (rank-side code in
device_error_cases.py). Its bad arguments, mismatches, dead and silent peers and leaks are checked
by the error matrix of both routes, tests/host/test_errors.py."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_error_cases as cases  # noqa: E402

from emulated_pools import DELAY_ENV as ENV  # noqa: E402  (the device matrix's pools)


def test_call_returns_before_data_is_ready_and_stream_order_holds(pool):
    assert pool(2, env=ENV).run(cases.stream_order) == [(True, True), (True, True)]


def test_work_wait_orders_another_stream(pool):
    assert pool(2, env=ENV).run(cases.work_wait_orders_another_stream) == [True, True]


@pytest.mark.parametrize("size", [3, 4])
def test_async_calls_on_two_streams_complete_in_order(pool, size):
    assert pool(size, env=ENV).run(cases.many_async_calls) == [[]] * size
