"""all_to_all with split sizes on host buffers through the C++ entry (issue #37 item 1; fast_call.cc
run_host_all_to_allv, the plan of device_all_to_allv.cc): exact at 2 and 3 ranks with zeros, ones,
primes and fewer elements than ranks, never on the Python path's batch; a wrong argument after
such calls still raises naming it (the Python path's checks)."""
import pytest

import host_a2av_entry_cases as cases
from a2av_argument_errors import A2AV_ARGUMENT_ERRORS


@pytest.mark.parametrize("P", [2, 3])
def test_host_all_to_all_with_splits_runs_from_the_entry(pool, P):
    for python_calls, declined, made, right in pool(P).run(cases.host_a2av_from_the_entry, timeout=60):
        assert (python_calls, declined, made, right) == (0, 0, 12, True), (python_calls, declined, made, right)


def test_a_wrong_host_all_to_all_argument_raises_naming_it(pool):
    want = A2AV_ARGUMENT_ERRORS
    for out in pool(2).run(cases.host_a2av_bad_arguments, timeout=60):
        assert [c for c, *_ in out] == list(want), out
        for case, kind, message in out:
            assert kind == want[case][0] and message.startswith(want[case][1]), (case, kind, message)
