"""Wrong keyword arguments (issue #37, session 27): ``async_op="yes"``, split sizes that are not
lists of ints and the like raise naming the argument before anything is sent, on host buffers and
on the emulated device, through the C++ entry and the Python route alike (the entry declines what
call_checks.py's one table, KEYWORDS, refuses; that table raises). Before: pybind11's TypeError
naming no argument on host buffers, an async call on device buffers for ``async_op="yes"``, and
``int()`` conversions of text, floats and bools for the splits (rank side: keyword_error_cases.py)."""
import pytest

from keyword_error_cases import BAD_KEYWORDS, bad_keywords

# What each raises: (type, start of the message).
EXPECTED = {
    "async_op text": ("TypeError", "async_op: expected a bool (True or False), got str 'yes'"),
    "async_op int": ("TypeError", "async_op: expected a bool (True or False), got int 1"),
    "async_op None": ("TypeError", "async_op: expected a bool (True or False), got NoneType None"),
    "async_op text, broadcast": ("TypeError", "async_op: expected a bool (True or False), got str 'no'"),
    "async_op text, all_to_all": ("TypeError", "async_op: expected a bool"),
    "async_op text, all_to_all with splits": ("TypeError", "async_op: expected a bool"),
    "async_op text, barrier": ("TypeError", "async_op: expected a bool"),
    "async_op text, sendrecv": ("TypeError", "async_op: expected a bool"),
    "output_splits an int": ("TypeError", "output_splits: expected a list of element counts (one per rank), got int 4"),
    "output_splits text": ("ValueError", "output_splits: must be an int, got str '2'"),
    "input_splits floats": ("ValueError", "input_splits: must be an int, got float 2.0"),
    "input_splits bools": ("ValueError", "input_splits: must be an int, got the bool True"),
}


@pytest.mark.timeout(180)
def test_a_wrong_keyword_raises_naming_it_on_every_route(pool):
    assert [label for label, _ in BAD_KEYWORDS] == list(EXPECTED)
    for out, exact in pool(2).run(bad_keywords, timeout=150):
        assert exact, "a right all_reduce after the wrong calls was not exact"
        assert sorted(out) == [("device", "entry"), ("device", "python"), ("host", "entry"), ("host", "python")]
        for (where, route), rows in out.items():
            for label, kind, message, sent, host_runs in rows:
                want_kind, want_start = EXPECTED[label]
                assert kind == want_kind and message.startswith(want_start), (where, route, label, kind, message)
                assert (sent, host_runs) == ({}, 0), (where, route, label, sent, host_runs)
