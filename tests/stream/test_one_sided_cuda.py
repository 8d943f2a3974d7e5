"""The one-sided kernel (csrc/kernels/plan_one_sided.cuh) on a real GPU (``@pytest.mark.gpu``:
skipped without one): the emulated matrix of test_one_sided_kernel.py, with torch CUDA tensors and
several ranks on GPU 0. torch's caching allocator gives cudaMalloc'd memory (mapped in place);
its cudaMallocAsync backend a stream-ordered pool no peer can map, so every call stages: in the
staging arena and through the slots (COMMLIB_DEVICE_STAGING), half the cases each. Every launch's
grid is checked against the SM count and the budget (a block per SM within it: more than 16 blocks
on a large GPU, issue #38). Run by scripts/gpu_check.sh's ``gpu`` and ``ranks`` steps."""
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
@pytest.mark.parametrize("allocator", ["caching", "cudaMallocAsync"])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_one_sided_matrix_on_cuda(pool, size, allocator):
    pytest.importorskip("torch")
    env = dict(ENV) if allocator == "caching" else dict(ENV, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    cases = [("mapped" if allocator == "caching" else ("arena", "slots")[i % 2], case)
             for i, (_, case) in enumerate(one_sided_cases(size))]
    results = pool(size, env=env).run(one_sided_matrix_cuda, cases, timeout=120)
    device_cases.check_results([(f, d) for f, d, _, _ in results])
    for _, _, paths, grids in results:
        assert paths == ["kernel"], paths
        for grid, sms, budget in grids:  # a block per SM, within every rank's budget (the same on every rank)
            assert grid == min(sms, budget or sms), (grid, sms, budget)
