"""Several tensors in one call on the Python backend: torch's contract for a tensor list.

torch's ``Backend`` methods take lists because a rank once ran one process over several devices:
the tensors of a list are this rank's contributions, as if from several devices. gloo implements
that contract, and so does the C++ backend (csrc/torch_backend/several.cc), with the same messages:

* ``all_reduce`` reduces every tensor of every rank (this rank's in list order first) into each;
* ``broadcast`` sends the root's ``tensors[opts.rootTensor]`` into every tensor of every rank;
* ``all_gather`` gathers every input of every rank into each output list
  (``output_tensors[i][r * k + j]``: rank r's input j);
* ``reduce``, ``reduce_scatter``, ``gather``, ``scatter``, ``send`` and ``recv`` take one tensor,
  as in gloo: several are a ``ValueError`` naming the argument, before anything is sent.

No public torch API passes several tensors (``dist.all_reduce`` passes one); they come from
callers of a group's methods. The tensors of a list are CPU tensors of one dtype and shape.
"""
from __future__ import annotations

import torch

from commlib.torch.staging import op_of


def one_tensor(tensors, name: str, what: str) -> None:
    """Refuse a list of other than one tensor where gloo takes one (``what``: the call's phrase)."""
    if len(tensors) != 1:
        raise ValueError(f"{name}: {what}, got {len(tensors)}")


def check_like(tensors, like, name: str) -> None:
    """Every tensor of ``tensors`` a dense CPU tensor of ``like``'s dtype and shape (gloo's "invalid
    tensor size/type"); a ``ValueError`` naming the first that is not."""
    for i, t in enumerate(tensors):
        if (t.layout != torch.strided or t.device.type != "cpu" or t.dtype != like.dtype
                or t.shape != like.shape):
            raise ValueError(f"{name}[{i}]: every tensor of the list must be a CPU tensor of the first "
                             "one's dtype and shape")


def _fold(acc: torch.Tensor, x: torch.Tensor, op: str) -> None:
    """acc = acc (op) x, in place: this rank's tensors reduced before the ranks' results are."""
    if op in ("sum", "avg", "premul_sum"):  # (premul_sum: the factor distributes over the sum)
        acc.logical_or_(x) if acc.dtype == torch.bool else acc.add_(x)
    elif op == "prod":
        acc.logical_and_(x) if acc.dtype == torch.bool else acc.mul_(x)
    elif op == "min":
        torch.minimum(acc, x, out=acc)
    elif op == "max":
        torch.maximum(acc, x, out=acc)
    elif op == "band":
        acc.bitwise_and_(x)
    elif op == "bor":
        acc.bitwise_or_(x)
    else:
        acc.bitwise_xor_(x)


def several_all_reduce(group, call, async_op, tensors, reduce_op) -> None:
    """all_reduce of several tensors: reduced here in list order, then one all_reduce of the
    result across ranks (every rank folds in the same order), copied into each tensor."""
    check_like(tensors, tensors[0], "tensors")
    op, _ = op_of(reduce_op)
    acc = tensors[0].detach().clone(memory_format=torch.contiguous_format)
    if op == "avg" and not (acc.is_floating_point() or acc.is_complex()):
        acc = acc.double()  # (the C++ backend averages integers in float64 too)
    for x in tensors[1:]:
        _fold(acc, x.detach(), op)
    group._allreduce_into(call, async_op, [acc], reduce_op)
    k = len(tensors)

    def spread():
        if op == "avg":  # the ranks were averaged over; the tensors of each rank too
            acc.div_(k)
        for t in tensors:
            t.copy_(acc)
    call.finals.append(spread)


def check_root_tensor(tensors, root_tensor: int) -> None:
    if not 0 <= root_tensor < len(tensors):
        raise ValueError(f"rootTensor: {root_tensor} is not an index of the {len(tensors)} tensors")


def several_all_gather_lists(output_tensors, input_tensors, size: int):
    """Check ``output_tensors`` against the contract (one list of world_size * k tensors per input)
    and return the per-rank staging outputs (rank r's k inputs side by side, one tensor each) and
    the finalizer that copies them into every output list."""
    k = len(input_tensors)
    check_like(input_tensors, input_tensors[0], "input_tensors")
    if len(output_tensors) != k:
        raise ValueError(f"output_tensors: has {len(output_tensors)} lists, expected one per input ({k})")
    lists = [list(o) for o in output_tensors]
    for i, outs in enumerate(lists):
        if len(outs) != size * k:
            raise ValueError(f"output_tensors[{i}]: has {len(outs)} tensors, expected world_size * inputs = "
                             f"{size * k}")
        check_like(outs, input_tensors[0], f"output_tensors[{i}]")
    packed_in = torch.stack([t.detach() for t in input_tensors])
    staged = [torch.empty_like(packed_in) for _ in range(size)]

    def unpack():
        for outs in lists:
            for b, o in enumerate(outs):
                o.copy_(staged[b // k][b % k])
    return packed_in, staged, unpack
