"""Rank-side functions: FullyShardedModule's default wrapping of a model with tied parameters
(a language model whose LM head shares the embedding's weight, as GPT-2's lm_head/wte do)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from parallel.dp_cases import TOL, digest, rel_err  # noqa: F401  (TOL: fp32, 1e-5 relative)

V, D, BATCH, SEQ, STEPS, LR = 16, 8, 8, 5, 3, 0.5


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(V, D)
        self.mlp = nn.Sequential(nn.Linear(D, D), nn.Tanh())
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, tokens):
        return self.lm_head(self.ln_f(self.mlp(self.wte(tokens))))


def _model():
    torch.manual_seed(0)
    return TiedLM()


def _data(step):
    g = torch.Generator().manual_seed(50 + step)
    d = torch.randint(0, V, (BATCH, SEQ + 1), generator=g)
    return d[:, :-1], d[:, 1:]


def _loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def _sgd(params):
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p -= LR * p.grad
                p.grad = None


def tied_default_wrap(comm) -> dict:
    """Train STEPS SGD steps sharded with the default wrapping; per step the relative error of the
    full state against single-process training and whether the tie survived."""
    from commlib.parallel import FullyShardedModule
    torch.set_num_threads(1)
    ref = _model()
    refs = []
    for s in range(STEPS):
        x, y = _data(s)
        _loss(ref(x), y).backward()
        _sgd(ref.parameters())
        refs.append({k: v.detach().clone() for k, v in ref.state_dict().items()})
    model = FullyShardedModule(_model(), comm)
    k = BATCH // comm.size
    errs, digests, tied = [], [], []
    for s in range(STEPS):
        x, y = _data(s)
        rows = slice(comm.rank * k, (comm.rank + 1) * k)
        _loss(model(x[rows]), y[rows]).backward()
        _sgd(model.parameters())
        st = model.full_state_dict()
        errs.append(rel_err(st, refs[s]))
        digests.append(digest(st.values()))
        tied.append(torch.equal(st["wte.weight"], st["lm_head.weight"]))
    return {"errs": errs, "digests": digests, "tied": tied, "units": model.unit_names,
            "tied_to_root": model.tied_to_root}
