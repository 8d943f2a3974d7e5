"""``dist.all_to_all_single`` with split sizes over the C++ backend (issue #44, session 28) is the
core's all_to_all with split sizes, numbered as a collective (``Communicator::all_to_allv`` through
core_api.h's ``all_to_allv``), as commlib's own routes number it (issue #37): a rank killed under
one is named by every survivor with ``all_to_all #n``, not the batch's ``send #n``, blocking and
async; and the call takes one call number whichever route a rank makes it through, so ranks calling
through torch and ranks calling through the group's communicator agree on it and on every call
after (rank side: a2av_split_cases.py)."""
import os

import pytest

import a2av_split_cases as cases
from commlib.testing import get_pool
from commlib.testing.faults import assert_survivors_named_the_dead_rank, run_killing_one_rank

pytestmark = pytest.mark.usefixtures("cpp_backend")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("async_op,victim", [(False, 1), (True, 0)])
def test_a_rank_killed_under_all_to_all_single_with_splits_is_named_with_the_collective(async_op, victim):
    before = set(os.listdir("/dev/shm"))
    results = run_killing_one_rank(3, victim, cases.kill_during_all_to_all_single, timeout=120,
                                   args=(async_op,))
    assert_survivors_named_the_dead_rank(results, victim, call="all_to_all #3 (", within_s=30)
    for rank, res in enumerate(results):
        if rank != victim:
            assert "send #" not in res[0] and "recv #" not in res[0], res[0]
    leaked = [f for f in set(os.listdir("/dev/shm")) - before if "commlib" in f]
    assert not leaked, f"left in /dev/shm: {leaked}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_torch_and_commlib_routes_number_all_to_all_with_splits_alike(n):
    sums = get_pool(n).run(cases.case_routes_number_alike)
    assert sums == [[float(n * (n + 1) // 2)] * 3] * n, sums


@pytest.mark.timeout(150)
def test_the_cuda_branch_names_the_collective_on_the_emulated_device():
    """device_exchange (the CUDA tensors' uneven all_to_all_single) on emulated memory through the
    backend's seam: the batch is numbered through device_all_to_allv, so the survivors name
    ``all_to_all #3`` (a plain batch named ``send #n``)."""
    from emulated_pools import DELAY_ENV
    victim = 2
    results = run_killing_one_rank(3, victim, cases.kill_during_device_exchange, env=DELAY_ENV, timeout=120)
    for rank, res in enumerate(results):
        if rank != victim and res is not None:
            assert res[2], f"rank {rank}: the first uneven all_to_all gave a wrong result"
    assert_survivors_named_the_dead_rank([r and r[:2] for r in results], victim, call="all_to_all #3 (",
                                         within_s=30)
    for rank, res in enumerate(results):
        if rank != victim:
            assert "send #" not in res[0], res[0]
