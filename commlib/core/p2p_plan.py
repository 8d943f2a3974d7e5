"""The messages of a point-to-point batch and of an all_to_all with splits, worked out and checked
before anything is sent. Pure functions of the arguments: commlib/core/communicator.py hands the result
to the host executor or to the stream engine."""
from __future__ import annotations

from commlib.device.dtypes import SIZE as _DTYPE_SIZE
from commlib.device.host_buffers import describe
from commlib.core.call_checks import split_sizes


def plan_all_to_allv(rank: int, size: int, ip: int, op_ptr: int, n_in: int, n_out: int, dtype: str,
                     input_splits, output_splits):
    """(messages, own block) of an all_to_all with per-rank block sizes.

    Messages are (is_send, address, elements, peer); the own block is (destination, source, bytes):
    this rank's block to itself, copied locally rather than sent.
    """
    ins = split_sizes(input_splits, n_in, size, "input_splits")
    outs = split_sizes(output_splits, n_out, size, "output_splits")
    es = _DTYPE_SIZE[dtype]
    in_off = [0] * size
    out_off = [0] * size
    for j in range(1, size):
        in_off[j] = in_off[j - 1] + ins[j - 1]
        out_off[j] = out_off[j - 1] + outs[j - 1]
    if ip < op_ptr + n_out * es and op_ptr < ip + n_in * es:
        raise ValueError("output: overlaps input; all_to_all with splits needs separate buffers")
    if ins[rank] != outs[rank]:
        raise ValueError(f"input_splits/output_splits: this rank sends itself {ins[rank]} elements "
                         f"but expects {outs[rank]}")
    ops = []
    for j in range(size):
        if j != rank:
            ops.append((True, ip + in_off[j] * es, ins[j], j))
            ops.append((False, op_ptr + out_off[j] * es, outs[j], j))
    own = (op_ptr + out_off[rank] * es, ip + in_off[rank] * es, ins[rank] * es)
    return ops, own


def check_one_per_peer(items):
    """Refuse a second send to, or receive from, one peer in a batch of device buffers (``items`` as
    plan_batch returns them): the stream engine moves one of each per peer and batch. (The host
    executor takes any number: it matches a pair's messages in call order.)"""
    seen = set()
    for i, (send, _, _, peer) in enumerate(items):
        kind = "send" if send else "recv"
        if (kind, peer) in seen:
            raise ValueError(f"ops[{i}]: a second {kind} with peer {peer} in one batch of device buffers (the "
                             "stream engine takes one send to and one receive from each peer per batch)")
        seen.add((kind, peer))


def plan_batch(ops, check_peer):
    """(messages, buffers, (argument name, buffer) pairs, dtype) of a batch of
    ("send"|"recv", tensor, peer) entries; ``check_peer(peer, name)`` refuses a bad peer and returns it as an int."""
    if not ops:
        raise ValueError("ops: empty batch")
    items, refs, named, dtype = [], [], [], None
    for i, entry in enumerate(ops):
        kind, tensor, peer = entry
        if kind not in ("send", "recv"):
            raise ValueError(f"ops[{i}]: kind must be 'send' or 'recv', got {kind!r}")
        peer = check_peer(peer, f"ops[{i}] peer" if len(ops) > 1 else "peer")  # as a Python int
        tname = "tensor" if len(ops) == 1 else f"ops[{i}] tensor"
        named.append((tname, tensor))
        ptr, n, dt = describe(tensor, tname)
        if dtype is None:
            dtype = dt
        elif dt != dtype:
            raise TypeError(f"ops[{i}] tensor: dtype {dt} differs from ops[0]'s {dtype}")
        items.append((kind == "send", ptr, n, peer))
        refs.append(tensor)
    return items, refs, named, dtype
