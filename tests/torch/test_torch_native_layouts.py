"""The layouts the C++ backend handed to the Python group until session 27 and now moves itself
(docs/torch_backend.md, "What still reaches the Python group"): expanded views as inputs of
all_to_all_single, the list forms and sends; all_gather_coalesced of blocks that differ from rank to
rank; reduce_scatter lists that need a cast. Each exact against every rank's data (and gloo where it
takes the call), on the C++ backend with nothing handed over and on the Python backend alone; an
expanded output fails alike on both. Rank side: native_layout_cases.py."""
import pytest

torch = pytest.importorskip("torch")

import native_layout_cases as cases  # noqa: E402
from commlib.testing import get_pool  # noqa: E402

pytestmark = pytest.mark.usefixtures("cpp_backend")  # (tests/torch/conftest.py)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", [cases.case_layouts_run_in_cpp, cases.case_expanded_outputs_fail_alike],
                         ids=lambda c: c.__name__[5:])
def test_layouts_the_python_group_moved_run_in_cpp(case, n):
    assert get_pool(n).run(case, timeout=150) == [True] * n
