"""Rank side of test_torch_native_calls.py's case for the CPU calls the C++ backend handed to the
Python backend until session 19 (issue #44 item 3) and now runs on the core itself: reductions of
dtypes the core does not reduce (cast, complex as pairs of reals) and of conjugate/negative views,
sparse all_reduce, uneven all_gather and reduce_scatter lists, and several tensors in one call
(torch's contract for a list, as gloo: all_reduce and broadcast over every tensor, all_gather of
every input). Each against gloo or the values every rank's data gives; ``handed_over`` (a spy on
every method of the Python group) must see none of them."""
from __future__ import annotations

import torch
import torch.distributed as dist

from backend_cases import _cmp, _data, setup
from native_call_cases import handed_over


def _every(P, shape, dtype, salt):
    return [_data(shape, dtype, q, salt) for q in range(P)]


def _refused(call, prefix, errors):
    try:
        call()
        errors.append(f"{prefix}: not refused")
    except ValueError as e:
        if not str(e).startswith(prefix):
            errors.append(f"{prefix}: {e}")


def case_staged_in_cpp(comm):
    st = setup(comm)
    gloo, P, r = st["gloo"], comm.size, comm.rank
    pg, gpg = dist.group.WORLD, gloo
    with handed_over() as seen:
        # dtypes the core does not reduce: int16 in int64, cast back (exact; products wrap alike)
        for k, (op, fold) in enumerate(((dist.ReduceOp.SUM, lambda v: v.sum(0)),
                                        (dist.ReduceOp.MAX, lambda v: v.max(0).values),
                                        (dist.ReduceOp.PRODUCT, lambda v: v.prod(0)))):
            for async_op in (False, True):
                t = _data((2, 3), torch.int16, r, k)
                w = dist.all_reduce(t, op=op, async_op=async_op)
                if async_op:
                    w.wait()
                want = fold(torch.stack([x.long() for x in _every(P, (2, 3), torch.int16, k)])).to(torch.int16)
                _cmp(f"all_reduce int16 {op}", t, want, True)
        # bool (as uint8: sum as max, min as min), against gloo
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN):
            t, ref = _data((7,), torch.bool, r, 3), _data((7,), torch.bool, r, 3)
            dist.all_reduce(t, op=op)
            dist.all_reduce(ref, op=op, group=gloo)
            _cmp(f"all_reduce bool {op}", t, ref, True)
        # complex as pairs of reals, and a conjugate view (the group's method: dist.all_reduce
        # would hand the backend a real view itself)
        xs = [torch.complex(a, b) for a, b in zip(_every(P, (4,), torch.float32, 4), _every(P, (4,), torch.float32, 5))]
        t = xs[r].clone()
        pg.allreduce([t]).wait()
        _cmp("all_reduce complex64", torch.view_as_real(t), torch.view_as_real(sum(xs)), False, steps=P)
        # conjugate and negative views: torch's dispatcher (its Conjugate/Negative fallbacks) decides
        # what a backend sees of them; the result must be gloo's
        for name, view in (("conj", lambda v: v.conj()), ("negative", torch._neg_view)):
            base = xs[r].clone() if name == "conj" else _data((5,), torch.float32, r, 6)
            ref = base.clone()
            pg.allreduce([view(base)]).wait()
            gpg.allreduce([view(ref)]).wait()
            _cmp(f"all_reduce {name} view", torch.view_as_real(base) if name == "conj" else base,
                 torch.view_as_real(ref) if name == "conj" else ref, False, steps=P)
        # reduce and reduce_scatter_tensor of int16, all_reduce_coalesced of three dtypes
        t = _data((6,), torch.int16, r, 7)
        dist.reduce(t, dst=P - 1)
        if r == P - 1:
            _cmp("reduce int16", t, sum(x.long() for x in _every(P, (6,), torch.int16, 7)).to(torch.int16), True)
        out = torch.zeros(3, dtype=torch.int16)
        dist.reduce_scatter_tensor(out, _data((3 * P,), torch.int16, r, 8))
        whole = sum(x.long() for x in _every(P, (3 * P,), torch.int16, 8)).to(torch.int16)
        _cmp("reduce_scatter_tensor int16", out, whole[3 * r:3 * r + 3], True)
        ts = [_data((3,), torch.float32, r, 9), _data((4,), torch.int16, r, 10), _data((5,), torch.bool, r, 11)]
        refs = [t.clone() for t in ts]
        pg.allreduce_coalesced(ts, dist.AllreduceCoalescedOptions()).wait()
        _cmp("coalesced float32", ts[0], sum(_every(P, (3,), torch.float32, 9)), False, steps=P)
        _cmp("coalesced int16", ts[1], sum(x.long() for x in _every(P, (4,), torch.int16, 10)).to(torch.int16), True)
        dist.all_reduce(refs[2], group=gloo)
        _cmp("coalesced bool", ts[2], refs[2], True)
        # uneven lists: all_gather of blocks of 1 + q rows, reduce_scatter of blocks of 2 + q
        outs = [torch.zeros(1 + q, 2, dtype=torch.int16) for q in range(P)]
        dist.all_gather(outs, _data((1 + r, 2), torch.int16, r, 12))
        for q in range(P):
            _cmp(f"uneven all_gather from {q}", outs[q], _data((1 + q, 2), torch.int16, q, 12), True)
        out = torch.zeros(2 + r)
        dist.reduce_scatter(out, [_data((2 + q,), torch.float32, r, 13 + q) for q in range(P)])
        _cmp("uneven reduce_scatter", out, sum(_data((2 + r,), torch.float32, q, 13 + r) for q in range(P)), False,
             steps=P)
        # sparse all_reduce (hybrid: a dense row per non-zero), against gloo
        idx = torch.tensor([[r, (r + 2) % 5, 4]])
        sp = torch.sparse_coo_tensor(idx, _data((3, 2), torch.float32, r, 14), (5, 2))
        ref = sp.clone()
        dist.all_reduce(sp)
        dist.all_reduce(ref, group=gloo)
        _cmp("sparse all_reduce", sp.to_dense(), ref.to_dense(), False, steps=P)
        # several tensors in one call: torch's contract for a list, as gloo
        a, b = _data((3,), torch.int64, r, 15), _data((3,), torch.int64, r, 16)
        ga, gb = a.clone(), b.clone()
        pg.allreduce([a, b]).wait()
        gpg.allreduce([ga, gb]).wait()
        _cmp("several all_reduce", torch.stack([a, b]), torch.stack([ga, gb]), True)
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = P - 1, 1
        a, b = _data((3,), torch.int64, r, 17), _data((3,), torch.int64, r, 18)
        ga, gb = a.clone(), b.clone()
        pg.broadcast([a, b], opts).wait()
        gpg.broadcast([ga, gb], opts).wait()
        _cmp("several broadcast", torch.stack([a, b]), torch.stack([ga, gb]), True)
        ins = [_data((2,), torch.float32, r, 19), _data((2,), torch.float32, r, 20)]
        outs = [[torch.zeros(2) for _ in range(2 * P)] for _ in range(2)]
        gouts = [[torch.zeros(2) for _ in range(2 * P)] for _ in range(2)]
        pg.allgather(outs, ins).wait()
        gpg.allgather(gouts, ins).wait()
        for i in range(2):
            _cmp(f"several all_gather {i}", torch.stack(outs[i]), torch.stack(gouts[i]), True)
    assert not seen, f"handed to the Python backend: {seen}"
    errors = []  # what gloo refuses with several tensors is refused here too, naming them
    _refused(lambda: pg.reduce([torch.zeros(2), torch.zeros(2)], dist.ReduceOptions()), "tensors:", errors)
    _refused(lambda: pg.send([torch.zeros(2), torch.zeros(2)], (r + 1) % P, 0), "tensors:", errors)
    _refused(lambda: pg.allreduce([torch.zeros(2, dtype=torch.bool)], _premul()), "op:", errors)
    dist.barrier()
    assert not errors, errors
    return True


def _premul():
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist._make_nccl_premul_sum(2.0)
    return opts
