"""torch's contract for a tensor list (several tensors in one call) and sparse sends and receives, on
the C++ backend and on the Python backend alone, each against gloo in the same processes (rank side:
several_cases.py): all_reduce, broadcast (rootTensor) and all_gather of several tensors equal gloo's;
reduce, reduce_scatter, send and recv of several, and sparse sends and receives, are refused naming
the argument, before anything is sent; the C++ backend hands none of it to the Python one."""
import pytest

torch = pytest.importorskip("torch")

import several_cases  # noqa: E402
from commlib.testing import get_pool  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpp_backend")  # (tests/torch/conftest.py)


@pytest.mark.parametrize("n", [2, 3])
def test_lists_and_sparse_p2p_as_on_gloo(n):
    assert get_pool(n).run(several_cases.case_list_contract, timeout=120) == [True] * n
