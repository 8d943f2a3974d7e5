"""The one-sided kernel (csrc/kernels/plan_one_sided.cuh) on a real GPU (``@pytest.mark.gpu``:
skipped without one): the emulated matrix of test_one_sided_kernel.py, with torch CUDA tensors and
several ranks on GPU 0. Run by scripts/gpu_check.sh's ``gpu`` and ``ranks`` steps."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_cases  # noqa: E402
from one_sided_cases import one_sided_matrix_cuda  # noqa: E402
from test_one_sided_kernel import one_sided_cases  # noqa: E402

# Short: a hang must show as an error within the GPU check's step, not eat it.
ENV = {"COMMLIB_TIMEOUT": "20"}


@pytest.mark.gpu
@pytest.mark.timeout(150)
@pytest.mark.parametrize("size", [2, 3, 4])
def test_one_sided_matrix_on_cuda(pool, size):
    pytest.importorskip("torch")
    results = pool(size, env=ENV).run(one_sided_matrix_cuda, one_sided_cases(size), timeout=120)
    device_cases.check_results([(f, d) for f, d, _ in results])
    for _, _, paths in results:
        assert paths == ["kernel"], paths
