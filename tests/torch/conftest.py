"""What tests/torch's modules share: the rank-side case modules beside them importable by bare name
(the test directories are not packages), and ``cpp_backend``, the skip of a test that needs the C++
backend where ``commlib._C_torch`` was not built (``COMMLIB_NO_TORCH_BACKEND=1``, or no torch at
build time)."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


@pytest.fixture
def cpp_backend():
    """The module ``commlib._C_torch``; skips the test where it was not built (or torch is missing).
    A module's ``pytestmark = pytest.mark.usefixtures("cpp_backend")`` applies it to every test."""
    pytest.importorskip("torch")
    from commlib.torch import native
    module = native.load()
    if module is None:
        pytest.skip("commlib._C_torch was not built")
    return module
