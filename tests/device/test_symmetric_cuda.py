"""The symmetric pool (commlib/device/symmetric.py) on a real GPU (``@pytest.mark.gpu``: skipped
without one): pool blocks as torch tensors through __cuda_array_interface__ and DLPack, CuPy
arrays, collectives on them (a mapped one-sided all_reduce on the pool's one registration), every
arena freed at close; 2 ranks on GPU 0. The emulated device's form is
test_peer_buffers.py's. Run by scripts/gpu_check.sh's ``gpu`` and ``ranks`` steps. Never run on a GPU yet."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import symmetric_cuda_cases as cases  # noqa: E402

ENV = {"COMMLIB_TIMEOUT": "20"}  # a hang shows as an error within the GPU check's step


@pytest.mark.gpu
@pytest.mark.timeout(90)
def test_the_symmetric_pool_on_cuda(pool):
    pytest.importorskip("torch")
    for results in pool(2, env=ENV).run(cases.symmetric_pool_on_cuda, timeout=60):
        assert all(ok for _, ok in results), results
