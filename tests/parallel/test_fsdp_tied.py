"""FullyShardedModule's default wrapping handles tied parameters without configuration (as torch's
fully_shard does): the shared weight is sharded in the root unit, training matches single-process
training within dp_cases.TOL (fp32, 1e-5 relative) and the tie holds after every step."""
from parallel import dp_cases as D
from parallel import fsdp_tied_cases as C


def test_tied_embedding_and_head_default_wrap(pool):
    res = pool(2).run(C.tied_default_wrap)
    D.assert_equivalent(res, tol=C.TOL, what="FullyShardedModule(tied wte/lm_head)")
    for r in res:
        assert all(r["tied"]), "wte.weight and lm_head.weight diverged"
        assert r["tied_to_root"] == ["wte.weight"]
        assert r["units"] == ["mlp", "ln_f", "<root>"]
