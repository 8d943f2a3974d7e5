"""Argument errors raised by the C++ backend itself (issue #44 item 3; rank side:
argument_error_cases.py): each bad call on CPU tensors raises on the C++ backend the class and text
the Python backend alone raises for it, and no method of the Python group is called (the spy of
native_call_cases.handed_over); the Python backend alone sends nothing for any of them. Fails if
any one of them is handed over again, or its message changes on either side."""
import pytest

torch = pytest.importorskip("torch")

import argument_error_cases as cases  # noqa: E402
from commlib.testing import get_pool  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpp_backend")  # (tests/torch/conftest.py)


@pytest.mark.parametrize("n", [2, 3])
def test_bad_arguments_raise_from_cpp_as_python_raised_them(n):
    results = get_pool(n).run(cases.case_argument_errors, timeout=120)
    for rank, (outcomes, right) in enumerate(results):
        assert right == [True, True], (rank, right)
        assert len(outcomes) == len(cases.bad_calls(n, rank)) >= 30
        for name, (cpp, python, seen, reached, issued) in outcomes.items():
            # (the Python backend's own message: the call reached it, and it refused before sending
            # anything: a coalesced call's earlier pair once went out, into buffers the raise freed)
            assert python is not None and reached, (rank, name, python, reached)
            assert issued == [], (rank, name, "the Python backend sent", issued)
            assert seen == [], (rank, name, "handed over", seen)
            assert cpp == python, (rank, name, cpp, python)
