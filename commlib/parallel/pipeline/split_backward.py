"""Zero-bubble's split backward: input gradients now (I), weight gradients later (W).

During a forward, the outputs of every module that owns parameters directly (a Linear, a
LayerNorm, an embedding...) are recorded. ``I`` runs one backward pass from the stage output to
the stage input *and* those outputs, without asking for any parameter: autograd then skips the
weight-gradient products (each node computes only the gradients that are needed). ``W`` later
runs, per module, a backward from its recorded outputs (with the gradients ``I`` found for them)
to its own parameters only; autograd prunes everything that does not lead to them, so ``W`` costs
the weight-gradient products and nothing of the activation-gradient chain.

This is exact when each parameter is reached only through its owner's outputs. A stage where a
parameter has two owners (tied inside the stage), or whose module records no output that requires
grad, falls back to ``W`` = a backward from the stage output to all its parameters (exact too,
but it walks the activation-gradient chain again).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch


def param_owners(module: torch.nn.Module) -> Optional[List[Tuple[torch.nn.Module, List[torch.Tensor]]]]:
    """The modules owning trainable parameters directly, with those parameters; None when a
    parameter has several owners (the split would be wrong, use the fallback)."""
    owners, seen = [], set()
    for m in module.modules():
        ps = [p for p in m._parameters.values() if p is not None and p.requires_grad]
        if not ps:
            continue
        for p in ps:
            if id(p) in seen:
                return None
            seen.add(id(p))
        owners.append((m, ps))
    return owners


class Recorder:
    """Records, during one forward, each owner's outputs that require grad."""

    def __init__(self, owners):
        self.owners = owners
        self.outputs: Dict[int, List[torch.Tensor]] = {}
        self.handles = []

    def __enter__(self):
        for i, (m, _) in enumerate(self.owners):
            self.handles.append(m.register_forward_hook(self._hook(i)))
        return self

    def _hook(self, i):
        def hook(module, args, output):
            if isinstance(output, torch.Tensor) and output.requires_grad:
                self.outputs.setdefault(i, []).append(output)
        return hook

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []

    def complete(self) -> bool:
        return all(i in self.outputs for i in range(len(self.owners)))


def backward_input(out, grad_out, x: Optional[torch.Tensor], rec: Optional[Recorder]):
    """The I pass: returns (gradient for ``x`` or None, per-owner gradients of its outputs)."""
    targets = [x] if x is not None else []
    flat = []
    if rec is not None:
        for i in sorted(rec.outputs):
            flat += [(i, y) for y in rec.outputs[i]]
    targets += [y for _, y in flat]
    if not targets:
        return None, {}
    grads = torch.autograd.grad(out, targets, grad_out, retain_graph=True, allow_unused=True)
    gx = grads[0] if x is not None else None
    per_owner: Dict[int, List[tuple]] = {}
    for (i, y), g in zip(flat, grads[len(targets) - len(flat):]):
        if g is not None:
            per_owner.setdefault(i, []).append((y, g))
    return gx, per_owner


def backward_weight(rec: Recorder, per_owner) -> None:
    """The W pass: each owner's parameters' gradients from its outputs' gradients."""
    for i, pairs in sorted(per_owner.items()):
        _, params = rec.owners[i]
        torch.autograd.backward([y for y, _ in pairs], [g for _, g in pairs], inputs=params,
                                retain_graph=True)
