"""The calls the C++ c10d::Backend (commlib._C_torch, csrc/torch_backend/) runs on the core itself
rather than handing them to the Python backend: sends and receives, batch_isend_irecv, the
coalesced collectives, uneven all-to-all, non-contiguous tensors and per-call timeouts, and
what it handed over until session 19 (cast and complex reductions, sparse all_reduce, uneven
lists, several tensors per call: native_staged_cases.py), each against gloo (rank side: native_call_cases.py),
and the works of blocking calls (reused, holding their tensors weakly: native_work_cases.py)."""
import pytest

torch = pytest.importorskip("torch")

import native_async_input_cases  # noqa: E402
import native_call_cases as cases  # noqa: E402
import native_staged_cases  # noqa: E402
import native_work_cases  # noqa: E402
from commlib.testing import get_pool  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpp_backend")  # (tests/torch/conftest.py)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", [cases.case_p2p, cases.case_p2p_several_per_peer, cases.case_coalesced, cases.case_uneven_all_to_all,
                                  cases.case_non_contiguous, native_staged_cases.case_staged_in_cpp,
                                  native_work_cases.case_blocking_works, native_async_input_cases.case_async_inputs_dropped],
                         ids=lambda c: c.__name__[5:])
def test_runs_in_cpp_as_on_gloo(case, n):
    assert get_pool(n).run(case, timeout=120) == [True] * n


@pytest.mark.parametrize("n", [2, 3])
def test_a_silent_peer_raises_within_the_calls_timeout(n):
    get_pool(n).run(cases.case_call_timeout, timeout=60)


@pytest.mark.parametrize("n", [2, 3])
def test_calls_moved_from_the_python_group_run_in_cpp(n):
    """PREMUL_SUM on int8/uint8/int32/int64 (all_reduce, reduce, reduce_scatter_tensor; a float and a
    0-d tensor factor), gather/scatter with a list on every rank (the non-roots' ignored) and
    reduce_scatter_tensor_coalesced over several dtypes (blocking and async): exact
    on the C++ backend with nothing handed over, and on the Python backend alone (session 26;
    native_moved_cases.py)."""
    import native_moved_cases
    assert get_pool(n).run(native_moved_cases.case_moved_calls, timeout=120) == [True] * n
