"""commlib.parallel on CUDA tensors (``@pytest.mark.gpu``: skipped without a CUDA device; rank
side in cuda_cases.py). Every rank of a pool uses GPU 0. Never run so far: no GPU has been lent
to this project; what runs in CI instead is the pipeline's device message path on the emulated
device (test_pipeline_device.py) and every CPU test of the same code."""
import pytest

from commlib.parallel.pipeline import actions as A
from parallel import cuda_cases as C
from parallel import dp_cases, pp_cases

torch = pytest.importorskip("torch")
needs_torch_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                      reason="this torch build has no CUDA device")


@pytest.mark.gpu
@needs_torch_cuda
@pytest.mark.parametrize("P", [2, 4])
def test_every_schedule_on_cuda_matches_single_process(pool, P):
    """GPipe, 1F1B, interleaved and zero-bubble (one and two stages per rank) on CUDA stages:
    losses, gradients and parameters within pp_cases.PP_TOL of one CPU process."""
    cases = pp_cases.matrix_for(P)
    results = pool(P).run(C.pipeline_matrix, cases, timeout=300)
    for rank, per_rank in enumerate(results):
        for r in per_rank:
            assert max(r["loss"], r["grad"], r["param"]) <= pp_cases.PP_TOL, (rank, r)
            kind, v, m, _ = r["case"]
            assert r["peak_in_flight"] == A.peak_in_flight(A.build_orders(kind, P * v, P, m))[rank], (rank, r)


@pytest.mark.gpu
@needs_torch_cuda
@pytest.mark.parametrize("P", [2, 4])
def test_tensor_and_sequence_parallel_on_cuda_match_one_process(pool, P):
    """The tensor- and sequence-parallel layers refuse no device: their collectives (and ring
    attention's K/V rotation) run on the current stream. Same tolerances as on the CPU."""
    from parallel import sp_cases
    for per_rank in pool(P).run(C.tensor_and_sequence, timeout=300):
        bad = {k: v for k, v in per_rank.items() if not v <= sp_cases.ATTN_TOL[k.split(".")[0]]}
        assert not bad, bad


@pytest.mark.gpu
@needs_torch_cuda
@pytest.mark.parametrize("kw", [{}, {"pull": "broadcast", "server_rank": 1, "same_init": True},
                                {"server_computes": False}])
def test_parameter_server_on_cuda_matches_single_process(pool, kw):
    res = pool(3).run(C.parameter_server, timeout=300, **kw)
    dp_cases.assert_equivalent(res, tol=C.PS_CUDA_TOL, what=f"ParameterServer on CUDA {kw}")
