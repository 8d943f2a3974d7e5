"""ZeroOptimizer (stages 1, 2) and FullyShardedModule (ZeRO-3): equivalence, sharded
checkpoints across world sizes, full state dicts, mixed precision and memory.

Tolerance: see tests/parallel/dp_cases.py (1e-5 relative per tensor, fp32).
"""
import pytest

from parallel import dp_cases as C
from parallel import zero_cases as Z

WORLDS = [2, 3, 4]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("method", ["zero1", "zero2", "zero3"])
@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_matches_single_process(pool, world, method, model):
    res = pool(world).run(C.train_equivalence, method, model)
    C.assert_equivalent(res, what=f"{method} {model} on {world} ranks")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["zero3", "zero1", "zero2"])
@pytest.mark.parametrize("worlds", [(2, 3), (4, 2)])
def test_checkpoint_reshards(pool, tmp_path, method, worlds):
    """Saved after 5 steps on one world size, loaded on another (fresh, differently initialised
    model), the run continues like an uninterrupted single-process run."""
    old, new = worlds
    path = str(tmp_path / "ckpt")
    saved = pool(old).run(Z.checkpoint_save, method, "transformer", path, 5)
    C.assert_equivalent(saved, what=f"{method} before saving on {old} ranks")
    resumed = pool(new).run(Z.checkpoint_resume, method, "transformer", path, 5)
    C.assert_equivalent(resumed, what=f"{method} resumed {old}->{new} ranks")


@pytest.mark.timeout(120)
def test_checkpoint_same_world_is_bitwise(pool, tmp_path):
    """Reloading on the same world size continues bitwise like the uninterrupted run."""
    path = str(tmp_path / "ckpt")
    full = pool(2).run(Z.checkpoint_save, "zero3", "transformer", str(tmp_path / "unused"), 8)
    pool(2).run(Z.checkpoint_save, "zero3", "transformer", path, 5)
    resumed = pool(2).run(Z.checkpoint_resume, "zero3", "transformer", path, 5, 8)
    assert resumed[0]["digests"] == full[0]["digests"][5:8]


@pytest.mark.timeout(120)
def test_checkpoint_mismatch_is_refused(pool, tmp_path):
    path = str(tmp_path / "ckpt")
    pool(2).run(Z.checkpoint_save, "zero3", "mlp", path, 1)
    msgs = pool(2).run(Z.checkpoint_mismatch, path)
    assert msgs[0] and "fc1" in msgs[0] and "(17, 8)" in msgs[0], msgs[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_state_dict_roundtrip(pool, stage):
    assert all(pool(2).run(Z.zero_state_dict_roundtrip, stage))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stage", [1, 2])
def test_zero_param_groups(pool, stage):
    res = pool(3).run(Z.zero_param_groups, stage)
    C.assert_equivalent(res, what=f"ZeroOptimizer(stage={stage}) with param groups")
    assert res[0]["groups"] == [(1e-3, 0.1), (5e-4, 0.0)]


@pytest.mark.timeout(60)
def test_zero2_reduce_scatters_during_backward(pool):
    for st in pool(2).run(Z.zero2_overlap):
        assert st["buckets"] >= 3 and st["launched_during_backward"] == st["buckets"]


@pytest.mark.timeout(60)
def test_fsdp_prefetch(pool):
    """With prefetch only the first unit of forward and of backward is gathered on demand; the
    others' all_gathers were already launched while the previous unit computed."""
    on, off = pool(2).run(Z.fsdp_prefetch, True)[0], pool(2).run(Z.fsdp_prefetch, False)[0]
    assert on == {"forward_hits": 3, "forward_misses": 1, "backward_hits": 3,
                  "backward_misses": 1}, on
    assert off["forward_hits"] == 0 and off["backward_hits"] == 0, off


@pytest.mark.timeout(60)
def test_full_state_dict(pool):
    for res in pool(3).run(Z.fsdp_state_dicts):
        assert res["same"], "full_state_dict differs from the original module's state_dict"
        assert res["r0_ok"], "rank0_only=True: wrong result"
        assert res["roundtrip"], "load_full_state_dict -> full_state_dict changed values"
        assert res["units"] == ["embed", "blocks", "ln_f", "head"]
        assert res["n_params"] == 4    # one flat shard per unit


@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["blocks", "list"])
def test_wrap_policies(pool, policy):
    res = pool(3).run(Z.fsdp_wrap_policy, policy)
    C.assert_equivalent(res, what=f"FullyShardedModule(wrap={policy})")
    assert res[0]["units"] == {"blocks": ["blocks.0", "blocks.1", "<root>"],
                               "list": ["blocks.1", "head", "<root>"]}[policy]


@pytest.mark.timeout(120)
def test_mixed_precision_bf16(pool):
    """bf16 compute, fp32 master weights, gradients and optimizer state. bf16 has an 8-bit
    mantissa, so the comparison with fp32 training uses a bf16-sized tolerance (5e-2)."""
    res = pool(2).run(Z.fsdp_mixed_precision)
    C.assert_equivalent(res, tol=5e-2, what="FullyShardedModule(mixed_precision=bf16)")
    assert res[0]["out_dtype"] == "torch.bfloat16"
    assert res[0]["master_dtypes"] == ["torch.float32"]


def _formulas(psi, n):
    """fp32 analogues of the ZeRO paper's per-rank bytes with Adam (params, grads, 8 bytes of
    Adam state per parameter); mixed-precision ZeRO-3 keeps fp32 shards, so also 16Ψ/N."""
    return {"dp": 16 * psi, "zero1": 8 * psi + 8 * psi / n, "zero2": 4 * psi + 12 * psi / n,
            "zero3": 16 * psi / n, "zero3_bf16": 16 * psi / n, "ps_server": 16 * psi,
            "ps_worker": 8 * psi}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_memory_matches_zero_formulas(pool, world):
    """Bytes actually held (distinct storages of params, grads, optimizer state) match the
    formulas within 10%; bucket/communication buffers are reported separately."""
    lines = []
    for method in ("dp", "zero1", "zero2", "zero3", "zero3_bf16", "ps"):
        res = pool(world).run(C.memory_report, method)
        for r, m in enumerate(res):
            key = method if method != "ps" else ("ps_server" if r == 0 else "ps_worker")
            expect = _formulas(m["psi"], world)[key]
            got = m["params"] + m["grads"] + m["optimizer"]
            lines.append(f"{key:11s} rank {r}: params {m['params']:8d} grads {m['grads']:8d} "
                         f"optimizer {m['optimizer']:8d} = {got:8d} B, formula {expect:10.0f} B "
                         f"(Ψ={m['psi']}), buckets {m['comm_buffers']} B")
            assert abs(got - expect) <= 0.10 * expect, lines[-1]
    print("\n" + "\n".join(lines))
