"""The data-movement collectives of the torch backend: all-gather, reduce-scatter, all-to-all,
gather and scatter, in their list, single-tensor and coalesced forms.

Uneven blocks (torch allows them in lists) are padded to the largest block for the core and cut
back by a finalizer; dtypes the core does not know move as bytes.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from commlib.torch.fast_path import (ALL_GATHER, ALL_TO_ALL, OP_BY_HASH, REDUCE_SCATTER,
                                     fast_collective)
from commlib.torch.devices import check_one_device
from commlib.torch.several import one_tensor, several_all_gather_lists
from commlib.torch.staging import NATIVE, as_bytes, check_reduction, op_of, out_bytes, reduction_staging

# torch.distributed does not re-export AllgatherOptions (torch 2.13; the other options it does):
# the defaults for callers that pass none come from its c10d module.
_AllgatherOptions = dist.distributed_c10d.AllgatherOptions


def _unpack_blocks(flat, outs, starts, counts):
    """Copy ``flat[starts[i]:starts[i] + counts[i]]`` into ``outs[i]`` (the finalizer of every
    call that gathers into one flat buffer: all-gather lists, gather, all-to-all lists). ``flat``
    holds either the outputs' dtype or bytes (dtypes the core does not know)."""
    with torch.no_grad():
        for o, start, n in zip(outs, starts, counts):
            blk = flat[start:start + n]
            o.copy_(blk.view(o.dtype).view(o.shape) if blk.dtype != o.dtype else blk.view(o.shape))


class DataMovementMixin:
    """Collectives of ``ProcessGroupCommlib`` that gather, scatter or exchange blocks (needs
    ``_comm``, ``_algo``, ``_run``, ``_issue``, ``_p2p`` and the latency path's ``_core_address``
    and ``_done_works``)."""

    # -- all_gather -------------------------------------------------------------------------
    def _check_gather_flat(self, outputs, inp):
        """_gather_flat's checks (outputs: one per rank, of the input's dtype, this rank's of its size)."""
        P = self.size()
        if len(outputs) != P:
            raise ValueError(f"output_tensor_list: has {len(outputs)} tensors, expected {P}")
        if any(o.dtype != inp.dtype for o in outputs):
            raise TypeError("output_tensor_list: dtypes differ from the input's")
        if outputs[self.rank()].numel() != inp.numel():
            raise ValueError(f"output_tensor_list[{self.rank()}]: has {outputs[self.rank()].numel()}"
                             f" elements, input has {inp.numel()}")

    def _gather_flat(self, call, async_op, outputs, inp):
        """all_gather ``inp`` into the list ``outputs`` (one tensor per rank, equal or not)."""
        P = self.size()
        self._check_gather_flat(outputs, inp)
        src = as_bytes(inp)
        n = src.numel()
        sizes = [as_bytes(o).numel() for o in outputs]
        m = max(sizes)
        if m != n:  # uneven: pad every block to the largest
            padded = torch.zeros(m, dtype=src.dtype, device=src.device)
            padded[:n] = src
            src = padded
        flat = torch.empty(m * P, dtype=src.dtype, device=src.device)
        self._issue(call, async_op, self._comm.all_gather(
            flat, src, algorithm=self._algo["all_gather"], async_op=async_op))

        call.finals.append(lambda: _unpack_blocks(flat, outputs, [r * m for r in range(P)], sizes))

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else _AllgatherOptions()
        if len(input_tensors) > 1:  # torch's contract for a list (several.py): one gather of them all
            packed, staged, unpack = several_all_gather_lists(output_tensors, input_tensors, self.size())

            def several(call, async_op):
                self._gather_flat(call, async_op, staged, packed)
                call.finals.append(unpack)
            return self._run(opts.asyncOp, [list(o) for o in output_tensors], several)
        if len(output_tensors) != len(input_tensors):
            raise ValueError(f"output_tensors: has {len(output_tensors)} lists, expected one per input "
                             f"({len(input_tensors)})")
        check_one_device(tensor=input_tensors[0], tensor_list=list(output_tensors[0]))

        def body(call, async_op):
            self._gather_flat(call, async_op, list(output_tensors[0]), input_tensors[0])
        return self._run(opts.asyncOp, [list(o) for o in output_tensors], body)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """torch passes one list per *rank* (``output_lists[r][i]``: rank r's i-th input), while
        ``allgather`` takes one list per *input*: transpose, after checking the shape."""
        opts = opts if opts is not None else _AllgatherOptions()
        P, ins = self.size(), list(input_list)
        output_lists = [list(o) for o in output_lists]
        if len(output_lists) != P:
            raise ValueError(f"output_lists: has {len(output_lists)} lists, expected one per rank ({P})")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(ins):
                raise ValueError(f"output_lists[{r}]: has {len(outs)} tensors, expected one per input "
                                 f"({len(ins)})")
        per_input = [[output_lists[r][i] for r in range(P)] for i in range(len(ins))]
        check_one_device(input_tensor_list=ins, output_tensor_lists=output_lists)
        for outs, inp in zip(per_input, ins):  # every input before any is sent
            self._check_gather_flat(outs, inp)

        def body(call, async_op):
            for outs, inp in zip(per_input, ins):
                self._gather_flat(call, async_op, outs, inp)
        return self._run(opts.asyncOp, output_lists, body)

    def _check_all_gather_single(self, output, inp):
        P = self.size()
        if output.dtype != inp.dtype:
            raise TypeError(f"output_tensor: dtype {output.dtype} differs from input's {inp.dtype}")
        if output.numel() != inp.numel() * P:
            raise ValueError(f"output_tensor: has {output.numel()} elements, expected "
                             f"world_size*input = {P}*{inp.numel()}")

    def _all_gather_single_into(self, call, async_op, output, inp):
        self._check_all_gather_single(output, inp)
        st = out_bytes(output)
        src = as_bytes(inp)
        self._issue(call, async_op, self._comm.all_gather(
            st.buf, src, algorithm=self._algo["all_gather"], async_op=async_op))
        if st.copy:
            call.finals.append(st.done)

    def all_gather_single(self, output_tensor, input_tensor, opts=None):
        # The latency path (fast_path.py), inline as in backend.py.
        if (opts is not None and not opts.asyncOp and not self._p2p
                and self._core_address is not None and fast_collective(
                    self._core_address, ALL_GATHER, input_tensor, output_tensor, None,
                    self._algo["all_gather"], 0, False, None) is None):
            return self._done_works.get([output_tensor])
        opts = opts if opts is not None else _AllgatherOptions()
        return self._run(opts.asyncOp, [output_tensor],
                         lambda c, a: self._all_gather_single_into(c, a, output_tensor, input_tensor))

    _allgather_base = all_gather_single

    def _pairwise(self, async_op, output_tensors, input_tensors, one, check):
        """The coalesced single-tensor forms: ``one(call, async_op, output, input)`` for each pair,
        as one call (one work for all), after ``check(output, input)`` of every pair: a bad pair
        raises before any is sent (an asynchronous call of an earlier pair would otherwise still be
        writing into buffers the raise let go). Lists of two lengths are refused first: zipped, the
        pairs past the shorter would be dropped without a word."""
        outs, ins = list(output_tensors), list(input_tensors)
        if len(outs) != len(ins):
            raise ValueError(f"output_tensors: has {len(outs)} tensors, expected one per input ({len(ins)})")
        for o, i in zip(outs, ins):
            check(o, i)

        def body(call, async_op):
            for o, i in zip(outs, ins):
                one(call, async_op, o, i)
        return self._run(async_op, outs, body)

    def all_gather_single_coalesced(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else _AllgatherOptions()
        return self._pairwise(opts.asyncOp, output_tensors, input_tensors, self._all_gather_single_into,
                              self._check_all_gather_single)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # -- reduce_scatter ---------------------------------------------------------------------
    def _check_reduce_scatter_single(self, output, inp, reduce_op):
        P = self.size()
        op, scale = op_of(reduce_op)
        if output.dtype != inp.dtype:
            raise TypeError(f"output: dtype {output.dtype} differs from input's {inp.dtype}")
        if inp.numel() != output.numel() * P:
            raise ValueError(f"input: has {inp.numel()} elements, expected world_size*output = "
                             f"{P}*{output.numel()}")
        check_reduction(output, op)
        return op, scale

    def _reduce_scatter_single_into(self, call, async_op, output, inp, reduce_op):
        op, scale = self._check_reduce_scatter_single(output, inp, reduce_op)
        obuf, op2, fin = reduction_staging(output, op)
        ibuf, _, _ = reduction_staging(inp, op)  # read only: views are fine
        self._issue(call, async_op, self._comm.reduce_scatter(
            obuf, ibuf, op=op2, algorithm=self._algo["reduce_scatter"], async_op=async_op,
            scale=scale if op2 == "premul_sum" else None))
        if fin is not None:
            call.finals.append(fin)

    def reduce_scatter_single(self, output_tensor, input_tensor, opts=None):
        if (opts is not None and not opts.asyncOp and not self._p2p
                and self._core_address is not None and fast_collective(
                    self._core_address, REDUCE_SCATTER, input_tensor, output_tensor,
                    OP_BY_HASH.get(hash(opts.reduceOp)), self._algo["reduce_scatter"], 0, False,
                    None) is None):
            return self._done_works.get([output_tensor])
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._run(opts.asyncOp, [output_tensor], lambda c, a: self._reduce_scatter_single_into(
            c, a, output_tensor, input_tensor, opts.reduceOp))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._pairwise(opts.asyncOp, output_tensors, input_tensors, lambda c, a, o, i:
                              self._reduce_scatter_single_into(c, a, o, i, opts.reduceOp),
                              lambda o, i: self._check_reduce_scatter_single(o, i, opts.reduceOp))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        outs = list(output_tensors)
        P = self.size()
        one_tensor(outs, "output_tensors", "reduce_scatter takes one output per call")  # (as gloo)
        if len(input_tensors) != 1:  # (zipped with the one output, the other lists would be dropped)
            raise ValueError(f"input_tensors: has {len(input_tensors)} lists, expected one per output (1)")
        check_one_device(output=outs[0], input_list=list(input_tensors[0]))

        def body(call, async_op):
            for out, ins in zip(outs, input_tensors):
                ins = list(ins)
                if len(ins) != P:
                    raise ValueError(f"input_list: has {len(ins)} tensors, expected {P}")
                sizes = [x.numel() for x in ins]
                if sizes[self.rank()] != out.numel():
                    raise ValueError(f"input_list[{self.rank()}]: has {sizes[self.rank()]} elements,"
                                     f" output has {out.numel()}")
                m = max(sizes)
                if all(s == m for s in sizes):
                    flat = torch.cat([x.detach().reshape(-1) for x in ins])
                else:  # uneven blocks: pad each to the largest (padding is discarded)
                    flat = torch.zeros(m * P, dtype=out.dtype, device=out.device)
                    for r, x in enumerate(ins):
                        flat[r * m:r * m + sizes[r]] = x.detach().reshape(-1)
                tmp = torch.empty(m, dtype=out.dtype, device=out.device)
                self._reduce_scatter_single_into(call, async_op, tmp, flat, opts.reduceOp)

                def fin(out=out, tmp=tmp):
                    with torch.no_grad():
                        out.copy_(tmp[:out.numel()].view(out.shape))
                call.finals.append(fin)
        return self._run(opts.asyncOp, outs, body)

    # -- all_to_all -------------------------------------------------------------------------
    def _alltoallv(self, call, async_op, obuf, ibuf, osplits, isplits):
        equal = (all(s == osplits[0] for s in osplits) and list(osplits) == list(isplits)
                 and obuf.numel() == ibuf.numel())
        if equal:
            w = self._comm.all_to_all(obuf, ibuf, algorithm=self._algo["all_to_all"],
                                      async_op=async_op)
        else:
            w = self._comm.all_to_all(obuf, ibuf, async_op=async_op,
                                      output_splits=list(osplits), input_splits=list(isplits))
        self._issue(call, async_op, w)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if (not output_split_sizes and not input_split_sizes and opts is not None
                and not opts.asyncOp and not self._p2p and self._core_address is not None
                and fast_collective(self._core_address, ALL_TO_ALL, input, output, None,
                                    self._algo["all_to_all"], 0, False, None) is None):
            return self._done_works.get([output])
        opts = opts if opts is not None else dist.AllToAllOptions()
        P = self.size()

        def body(call, async_op):
            if output.dtype != input.dtype:
                raise TypeError(f"output: dtype {output.dtype} differs from input's {input.dtype}")
            st = out_bytes(output)
            ibuf = as_bytes(input)
            if ibuf.data_ptr() == st.buf.data_ptr() and ibuf.numel():
                ibuf = ibuf.clone()
            o_row = st.buf.numel() // output.shape[0] if output.dim() and output.shape[0] else 0
            i_row = ibuf.numel() // input.shape[0] if input.dim() and input.shape[0] else 0
            if output_split_sizes:
                osp = [int(s) * o_row for s in output_split_sizes]
            else:
                if st.buf.numel() % P:
                    raise ValueError(f"output: {output.numel()} elements do not split over {P} ranks "
                                     "(give output_split_sizes)")
                osp = [st.buf.numel() // P] * P
            if input_split_sizes:
                isp = [int(s) * i_row for s in input_split_sizes]
            else:
                if ibuf.numel() % P:
                    raise ValueError(f"input: {input.numel()} elements do not split over {P} ranks "
                                     "(give input_split_sizes)")
                isp = [ibuf.numel() // P] * P
            self._alltoallv(call, async_op, st.buf, ibuf, osp, isp)
            if st.copy:
                call.finals.append(st.done)
        return self._run(opts.asyncOp, [output], body)

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        outs, ins = list(output_tensors), list(input_tensors)
        P = self.size()
        check_one_device(input_tensor_list=ins, output_tensor_list=outs)

        def body(call, async_op):
            if len(outs) != P or len(ins) != P:
                raise ValueError(f"alltoall: expected {P} output and {P} input tensors")
            dt = ins[0].dtype
            if any(x.dtype != dt for x in outs + ins):
                raise TypeError("alltoall: all tensors must have the same dtype")
            ib = [as_bytes(x) for x in ins]
            ibuf = torch.cat(ib) if ib else torch.empty(0)
            osp = [as_bytes(o).numel() if o.is_contiguous() else o.numel() * (
                1 if o.dtype in NATIVE else o.element_size()) for o in outs]
            obuf = torch.empty(sum(osp), dtype=ibuf.dtype, device=ibuf.device)
            self._alltoallv(call, async_op, obuf, ibuf, osp, [x.numel() for x in ib])

            starts = [sum(osp[:r]) for r in range(P)]
            call.finals.append(lambda: _unpack_blocks(obuf, outs, starts, osp))
        return self._run(opts.asyncOp, outs, body)

    # -- gather / scatter -------------------------------------------------------------------
    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        one_tensor(input_tensors, "input_tensors", "gather takes one input per call")  # (as gloo)
        result = [list(o) for o in output_tensors] if output_tensors else []
        return self._rooted("gather", opts, input_tensors[0], lambda: output_tensors[0], result)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        one_tensor(output_tensors, "output_tensors", "scatter takes one output per call")  # (as gloo)
        return self._rooted("scatter", opts, output_tensors[0], lambda: input_tensors[0], list(output_tensors))

    def _rooted(self, kind, opts, mine, root_list, result):
        """gather and scatter, one body. Every rank has one tensor ``mine`` (gather's input,
        scatter's output); the root also has ``root_list()``, one tensor per rank (gather_list,
        scatter_list), each checked to have ``mine``'s size and dtype. The root's side moves
        through one flat buffer on ``mine``'s device: the path is ``mine``'s, and a scatter_list
        elsewhere is copied there first."""
        root, P, gather = opts.rootRank, self.size(), kind == "gather"
        name, role = f"{kind}_list", "input" if gather else "output"

        def body(call, async_op):
            staged = None if gather else out_bytes(mine)
            local = as_bytes(mine) if gather else staged.buf
            listed, flat = [], None
            if self.rank() == root:
                listed = list(root_list())
                if len(listed) != P:
                    raise ValueError(f"{name}: has {len(listed)} tensors, expected {P}")
                for r, t in enumerate(listed):
                    if t.numel() != mine.numel() or t.dtype != mine.dtype:
                        raise ValueError(f"{name}[{r}]: size/dtype differs from the {role}'s")
                flat = (torch.empty(local.numel() * P, dtype=local.dtype, device=local.device) if gather
                        else torch.cat([as_bytes(x).to(local.device) for x in listed]))
            out, inp = (flat, local) if gather else (local, flat)
            self._issue(call, async_op, getattr(self._comm, kind)(
                out, inp, root=root, algorithm=self._algo[kind], async_op=async_op))
            if gather and self.rank() == root:
                n = local.numel()
                call.finals.append(lambda: _unpack_blocks(flat, listed, [r * n for r in range(P)], [n] * P))
            elif staged is not None and staged.copy:
                call.finals.append(staged.done)
        return self._run(opts.asyncOp, result, body, tensors=[mine])
