"""Tensor-parallel layers against the unsharded torch layers, forward and backward, on 2 and 4 ranks.

Tolerance (fp32): max |sharded - unsharded| / max(1, max |unsharded|) <= 1e-5 (tp_cases.TP_TOL);
the column-parallel forward is compared bitwise (torch.equal). Rank-side code: tp_cases.py.
"""
import pytest

from parallel import tp_cases as C

CASES = [
    ("column", C.column_linear, (False,)),
    ("column_transposed", C.column_linear, (True,)),
    ("row", C.row_linear, (False,)),
    ("row_transposed", C.row_linear, (True,)),
    ("mlp", C.mlp, (False,)),
    ("mlp_sequence_parallel", C.mlp, (True,)),
    ("feature_gather_scatter", C.feature_linear, ()),
    ("vocab_embedding_ce", C.vocab_parallel, (False,)),
    ("vocab_embedding_ce_sequence_parallel", C.vocab_parallel, (True,)),
    ("attention", C.parallel_attention, (False,)),
    ("attention_sequence_parallel", C.parallel_attention, (True,)),
    ("all_to_all_autograd", C.all_to_all_grad, ()),
]


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("name,fn,args", CASES, ids=[c[0] for c in CASES])
def test_tp_layer_matches_unsharded(pool, n, name, fn, args):
    errs = pool(n).run(fn, *args)  # every rank asserts its own errors
    worst = max(max(e.values()) for e in errs)
    assert worst <= C.TP_TOL, (name, worst)


def test_strategy_rule():
    from commlib.parallel.tensor import choose_strategy
    assert choose_strategy(64, 1024) == "gather"   # narrow input: move the input
    assert choose_strategy(1024, 64) == "scatter"  # narrow output: move the partial outputs


def test_uneven_split_is_refused():
    from commlib.parallel.tensor import ColumnParallelLinear

    class Fake:
        rank, size = 0, 3
    with pytest.raises(ValueError, match="out_features"):
        ColumnParallelLinear(4, 8, Fake())
