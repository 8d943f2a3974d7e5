"""Rank-side functions for the tiny GPT trained sharded over (tensor, context) parallel groups
against one process (run by commlib.testing rank pools, imported as ``parallel.gpt_cases``).
"""
from __future__ import annotations

from commlib.models import gpt as _gpt
from parallel.tp_cases import _check, _err, _one_thread, _sl

GPT_TOL = 1e-5  # |loss_sharded - loss_single| per step and final-parameter error, fp32, 10 SGD steps
_REF = {}


def _close(groups):
    for g in groups.values():
        if hasattr(g, "close"):
            g.close()


@_one_thread
def gpt_train(comm, tp_size, cp_size, cp_mode="ring", layout="contiguous", sp=False, ulysses_size=None,
              steps=10):
    """Train the tiny GPT ``steps`` SGD steps sharded over (tp, cp) and single-process; compare."""
    cfg = _gpt.GPTConfig()
    if steps not in _REF:
        ref = _gpt.TinyGPT(cfg)
        _REF[steps] = (_gpt.train(ref, steps), ref)
    ref_losses, ref = _REF[steps]
    groups = _gpt.make_groups(comm, tp_size, cp_size, ulysses_size)
    try:
        m = _gpt.TinyGPT(cfg, groups, cp_mode=cp_mode, layout=layout, sequence_parallel=sp)
        losses = _gpt.train(m, steps)
        tp = groups["tp"]
        V = cfg.vocab
        errs = {"loss": max(abs(a - b) for a, b in zip(losses, ref_losses)),
                "wte": _err(m.wte.weight, ref.wte.weight[_sl(V, tp)]),
                "head": _err(m.head.weight, ref.head.weight[_sl(V, tp)]),
                "fc2.W": _err(m.blocks[1].fc2.weight, ref.blocks[1].fc2.weight[:, _sl(4 * cfg.d_model, tp)]),
                "wpe": _err(m.wpe, ref.wpe),
                "ln1.w": _err(m.blocks[0].ln1.weight, ref.blocks[0].ln1.weight),
                "ln_f.b": _err(m.ln_f.bias, ref.ln_f.bias)}
        assert losses[-1] < losses[0], "loss did not go down"
        errs["first_loss"], errs["last_loss"] = losses[0], losses[-1]
        check = {k: v for k, v in errs.items() if not k.endswith("_loss")}
        _check(check, GPT_TOL)
        return errs
    finally:
        _close(groups)
