"""Rank side of tests/torch/test_torch_native_calls.py: the calls the C++ backend (commlib._C_torch)
runs on the core itself since #44's second increment: sends and receives (held back and batched,
receive from any source, batch_isend_irecv as one coalesced work), the coalesced collectives,
uneven and list all-to-all, non-contiguous tensors, and torch's per-call timeout. Results are
compared with gloo in the same processes (or with the values the sender encoded), and
``handed_over`` checks that none of these calls reached the Python backend."""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

import commlib.torch
from backend_cases import _cmp, _data, setup
from spies import spy_methods

# Every method of the Python backend the C++ one could hand a call to.
_PY_METHODS = ("send", "recv", "recv_anysource", "allreduce", "allreduce_coalesced", "broadcast", "reduce",
               "allgather", "_allgather_base", "allgather_into_tensor_coalesced", "allgather_coalesced",
               "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "alltoall_base",
               "alltoall", "gather", "scatter")
DTYPES = (torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.complex64, torch.int16)


def handed_over(group=None):
    """The names of the calls the C++ backend of ``group`` handed to its Python backend inside
    (each when it is made: a hand-over that then raises was a hand-over)."""
    return spy_methods(commlib.torch.python_group(group), _PY_METHODS)


_GLOO_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
                torch.int64)


def _as_gloo(t):
    """``t`` as gloo takes it: a dtype gloo has no kernel for (bool, int16) as its bytes, along the
    last dimension (so blocks of dim 0 stay blocks): what moves is the same either way."""
    return t if t.dtype in _GLOO_DTYPES else t.view(torch.uint8)


def _message(src, dst, shape, dtype, salt):
    """What ``src`` sends ``dst``: encodes both, so a message from the wrong peer or slot shows."""
    return _data(shape, dtype, 97 * src + dst, salt)


def case_p2p(comm):
    """Receive-first rings over every dtype and count (0, 1, 1000 elements), three messages per
    pair in order, batch_isend_irecv as one work, non-contiguous tensors, receive from any source,
    futures asked for before anything waited; refusals name the argument."""
    st = setup(comm)
    P, r = comm.size, comm.rank
    nxt, prv = (r + 1) % P, (r - 1) % P
    with handed_over() as seen:
        for k, (dt, n) in enumerate((dt, n) for dt in DTYPES for n in (0, 1, 1000)):
            got = torch.zeros(n, dtype=dt)
            wr = dist.irecv(got, prv)
            ws = dist.isend(_message(r, nxt, (n,), dt, k), nxt)
            (wr if k % 2 else ws).wait()
            (ws if k % 2 else wr).wait()
            _cmp(f"ring {dt} x {n}", got, _message(prv, r, (n,), dt, k), True)
        # three messages to the same peer match in call order, the receives posted first
        gots = [torch.zeros(5, dtype=torch.int64) for _ in range(3)]
        works = [dist.irecv(g, prv) for g in gots] + [dist.isend(_message(r, nxt, (5,), torch.int64, 50 + i), nxt)
                                                      for i in range(3)]
        futs = [w.get_future() for w in works]  # futures complete without anyone calling wait()
        torch.futures.wait_all(futs)
        for i, g in enumerate(gots):
            _cmp(f"message {i}", g, _message(prv, r, (5,), torch.int64, 50 + i), True)
        # batch_isend_irecv: every pair, one coalesced work (supportsCoalescing)
        peers = [p for p in range(P) if p != r]
        gots = {p: torch.zeros(7) for p in peers}
        ops = [dist.P2POp(dist.irecv, gots[p], p) for p in peers]
        ops += [dist.P2POp(dist.isend, _message(r, p, (7,), torch.float32, 60), p) for p in peers]
        reqs = dist.batch_isend_irecv(ops)
        assert len(reqs) == 1, f"batch_isend_irecv gave {len(reqs)} works, expected one coalesced work"
        reqs[0].wait()
        for p in peers:
            _cmp(f"batch from {p}", gots[p], _message(p, r, (7,), torch.float32, 60), True)
        # non-contiguous: a transposed tensor sent, received into a sliced one (gloo refuses both)
        buf = torch.zeros(4, 6)
        wr = dist.irecv(buf[:, ::2], prv)
        dist.isend(_message(r, nxt, (3, 4), torch.float32, 80).t(), nxt).wait()
        wr.wait()
        _cmp("non-contiguous", buf[:, ::2], _message(prv, r, (3, 4), torch.float32, 80).t(), True)
        assert not buf[:, 1::2].any(), "a receive into a sliced tensor wrote between its elements"
        # receive from any source: every other rank sends rank 0 its rank
        if r == 0:
            senders = set()
            for _ in peers:
                t = torch.zeros(3, dtype=torch.int32)
                src = dist.recv(t)
                assert torch.equal(t, torch.full((3,), src, dtype=torch.int32)), (src, t)
                senders.add(src)
            assert senders == set(peers), senders
        else:
            dist.send(torch.full((3,), r, dtype=torch.int32), 0)
    assert not seen, f"handed to the Python backend: {seen}"
    errors = []  # the group's own methods (torch's Python API refuses a bad peer itself first)
    pg = dist.group.WORLD
    for bad, call in (("dst", lambda: pg.send([torch.zeros(2)], r, 0)),
                      ("src", lambda: pg.recv([torch.zeros(2)], P, 0))):
        try:
            call()
            errors.append(f"{bad}: not refused")
        except ValueError as e:
            if not str(e).startswith(f"{bad}: "):
                errors.append(f"{bad}: {e}")
    dist.barrier()
    assert not errors, errors
    # the same ring over gloo, for parity of what users see
    got = torch.zeros(4)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, prv, group=st["gloo"]),
                                   dist.P2POp(dist.isend, _message(r, nxt, (4,), torch.float32, 70), nxt,
                                              group=st["gloo"])])
    for q in reqs:
        q.wait()
    _cmp("gloo ring", got, _message(prv, r, (4,), torch.float32, 70), True)
    return True


def case_p2p_several_per_peer(comm):
    """batch_isend_irecv with three sends to and three receives from every peer (int64, float64 2-D,
    uint8), the receives first, on gloo and on commlib in the same processes: the same tensors
    arrive; commlib issues the batch as one batch of the core (the host's batch_p2p takes several
    messages per peer, in call order), counted by the backend (`_host_p2p_batches`); and a receive-first
    isend/irecv ring of two messages per pair (waited on in turn) as one batch too."""
    st = setup(comm)
    P, r = comm.size, comm.rank
    peers = [p for p in range(P) if p != r]
    shapes = [((5,), torch.int64), ((3, 4), torch.float64), ((9,), torch.uint8)]
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    got = {}
    with handed_over() as seen:
        for name in ("gloo", "world"):
            g = st[name]
            recvs = {(p, i): torch.zeros(s, dtype=dt) for p in peers for i, (s, dt) in enumerate(shapes)}
            ops = [dist.P2POp(dist.irecv, t, p, group=g) for (p, _), t in recvs.items()]
            ops += [dist.P2POp(dist.isend, _message(r, p, s, dt, 100 + i), p, group=g)
                    for p in peers for i, (s, dt) in enumerate(shapes)]
            before = backend._host_p2p_batches
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            got[name] = (recvs, backend._host_p2p_batches - before)
        nxt, prv = (r + 1) % P, (r - 1) % P
        ring = [torch.zeros(4, dtype=torch.int32) for _ in range(2)]
        before = backend._host_p2p_batches
        works = [dist.irecv(t, prv) for t in ring] + [dist.isend(_message(r, nxt, (4,), torch.int32, 110 + i), nxt)
                                                     for i in range(2)]
        for w in works:
            w.wait()
        ring_batches = backend._host_p2p_batches - before
    assert not seen, f"handed to the Python backend: {seen}"
    for (p, i), t in got["world"][0].items():
        want = _message(p, r, *shapes[i], 100 + i)
        _cmp(f"message {i} from {p}", t, want, True)
        _cmp(f"gloo message {i} from {p}", got["gloo"][0][(p, i)], want, True)
    for i, t in enumerate(ring):
        _cmp(f"ring message {i}", t, _message(prv, r, (4,), torch.int32, 110 + i), True)
    assert got["gloo"][1] == 0, f"gloo's batch went through commlib's backend: {got['gloo'][1]}"
    assert got["world"][1] == 1, f"commlib issued the batch as {got['world'][1]} batches of the core, expected one"
    assert ring_batches == 1, f"commlib issued the ring as {ring_batches} batches of the core, expected one"
    return True


def _coalesced_block(group, kind, tensors, async_ops, device):
    from torch.distributed.distributed_c10d import _coalescing_manager
    with _coalescing_manager(group=group, device=device, async_ops=async_ops) as cm:
        for t in tensors:
            if kind == "all_reduce":
                dist.all_reduce(t[0], group=group)
            elif kind == "all_gather":
                dist.all_gather_into_tensor(t[1], t[0], group=group)
            else:
                dist.reduce_scatter_tensor(t[1], t[0], group=group)
    if async_ops:
        cm.wait()


def case_coalesced(comm):
    """The three coalesced collectives over dtypes (mixed dtypes for all-gathers), empty and 2-D and
    non-contiguous tensors, blocking and async, with and without a device (which opens a C++
    coalescing block), and all_gather_coalesced (its lists, into transposed outputs too), against
    the same calls on gloo one by one."""
    st = setup(comm)
    gloo, P, r = st["gloo"], comm.size, comm.rank
    cpu = torch.device("cpu")
    shapes = ((3,), (0,), (2, 5), "t")  # "t": a transposed (non-contiguous) 3 x 2
    with handed_over() as seen:
        for k, (dt, async_ops, device) in enumerate(
                (dt, a, d) for dt in (torch.float32, torch.int64, torch.bfloat16) for a in (False, True)
                for d in (None, cpu)):
            def make(shape, salt, rows=1):
                if shape == "t":
                    return _data((2, 3 * rows), dt, r, salt).t()
                return _data((shape[0] * rows,) + tuple(shape[1:]), dt, r, salt)
            ts = [[make(s, 10 * k + i)] for i, s in enumerate(shapes)]
            refs = [t[0].clone() for t in ts]
            _coalesced_block(None, "all_reduce", ts, async_ops, device)
            for t, ref in zip(ts, refs):
                dist.all_reduce(ref, group=gloo)
                _cmp(f"all_reduce_coalesced {dt}", t[0], ref, False, steps=P)
            mixed = [dt, torch.int16, torch.bool, torch.float64]
            pairs = [[_data((2 + i, 3), mixed[i], r, 20 * k + i), None] for i in range(4)]
            for p in pairs:
                p[1] = torch.zeros((P * p[0].shape[0], 3), dtype=p[0].dtype)
            _coalesced_block(None, "all_gather", pairs, async_ops, device)
            for inp, out in pairs:
                ref = torch.zeros_like(_as_gloo(out))
                dist.all_gather_into_tensor(ref, _as_gloo(inp), group=gloo)
                _cmp(f"all_gather_coalesced {inp.dtype}", _as_gloo(out), ref, True)
            pairs = [[make(s, 30 * k + i, rows=P), None] for i, s in enumerate(shapes)]
            for p in pairs:
                shape = (p[0].shape[0] // P,) + tuple(p[0].shape[1:])
                p[1] = torch.zeros(shape[::-1], dtype=dt).t() if p[0].dim() == 2 and not p[0].is_contiguous() \
                    else torch.zeros(shape, dtype=dt)
            _coalesced_block(None, "reduce_scatter", pairs, async_ops, device)
            for inp, out in pairs:
                ref = torch.zeros_like(out)
                dist.reduce_scatter_tensor(ref, inp.contiguous(), group=gloo)
                _cmp(f"reduce_scatter_coalesced {dt}", out, ref, False, steps=P)
            # all_gather_coalesced (lists: one output list per rank; torch takes one dtype), empty
            # and transposed tensors
            ins = [make(s, 40 * k + i) for i, s in enumerate(shapes)]
            outs = [[torch.zeros(x.shape[::-1], dtype=x.dtype).t() if x.dim() == 2 else torch.zeros_like(x)
                     for x in ins] for _ in range(P)]
            w = dist.all_gather_coalesced(outs, ins, async_op=async_ops)
            if async_ops:
                w.wait()
            for q in range(P):
                for i, x in enumerate(ins):
                    want = [torch.zeros_like(x) for _ in range(P)]
                    dist.all_gather(want, x.contiguous(), group=gloo)
                    _cmp(f"all_gather_coalesced list {q} {i} {x.dtype}", outs[q][i], want[q], True)
    assert not seen, f"handed to the Python backend: {seen}"
    return True


def _splits(P, salt):
    """f(i, j): rows rank i sends rank j (0, 1 or 2: some blocks are empty)."""
    return lambda i, j: (i + 2 * j + salt) % 3


def case_uneven_all_to_all(comm):
    """all_to_all_single with split sizes (rows of 2-D tensors; some blocks empty; against gloo) and
    the list form with blocks of different sizes (against what the senders encoded), over dtypes
    the core knows and bytes, blocking and async."""
    st = setup(comm)
    gloo, P, r = st["gloo"], comm.size, comm.rank
    with handed_over() as seen:
        for k, (dt, async_op) in enumerate((dt, a) for dt in (torch.float32, torch.int16, torch.bool, torch.int64)
                                           for a in (False, True)):
            f = _splits(P, k)
            ins = [f(r, j) for j in range(P)]
            outs = [f(i, r) for i in range(P)]
            x = _data((sum(ins), 3), dt, r, k)
            got, ref = torch.zeros((sum(outs), 3), dtype=dt), torch.zeros((sum(outs), 3), dtype=dt)
            w = dist.all_to_all_single(got, x, outs, ins, async_op=async_op)
            if async_op:
                w.wait()
            ref = _as_gloo(ref)
            dist.all_to_all_single(ref, _as_gloo(x), outs, ins, group=gloo)
            _cmp(f"all_to_all_single splits {dt}", _as_gloo(got), ref, True)
            xs = [_data((f(r, j) + 1, 2), dt, r, 40 + k + j) for j in range(P)]
            got = [torch.zeros((f(i, r) + 1, 2), dtype=dt) for i in range(P)]
            w = dist.all_to_all(got, xs, async_op=async_op)
            if async_op:
                w.wait()
            for i in range(P):  # (gloo's list form takes equal sizes only: what rank i sent is known)
                _cmp(f"all_to_all list {dt} from {i}", got[i], _data((f(i, r) + 1, 2), dt, i, 40 + k + r), True)
    assert not seen, f"handed to the Python backend: {seen}"
    errors = []
    try:  # refused before anything is sent, naming the argument
        dist.all_to_all_single(torch.zeros(4), torch.zeros(4), [1] * P, [5] + [1] * (P - 1))
        errors.append("bad input_split_sizes not refused")
    except ValueError as e:
        if "input_split_sizes" not in str(e):
            errors.append(str(e))
    dist.barrier()
    assert not errors, errors
    return True


def case_non_contiguous(comm):
    """Every collective on transposed and on sliced (strided) tensors: contiguous copies in,
    results copied back, equal to gloo's on contiguous copies of the same tensors. (gloo itself
    takes the first tensors' memory as it lies: right for a transposed tensor, but a sliced one
    reads elements it does not hold, and ranks then disagree; seen here, so gloo is given copies.)"""
    st = setup(comm)
    gloo, P, r = st["gloo"], comm.size, comm.rank

    def shaped(kind, shape, salt):
        """A non-contiguous float tensor of logical ``shape`` (2-D), the same values per salt."""
        if kind == "transposed":
            return _data(shape[::-1], torch.float32, r, salt).t()
        return _data((shape[0], 2 * shape[1]), torch.float32, r, salt)[:, ::2]

    with handed_over() as seen:
        for kind in ("transposed", "sliced"):
            for name, run in (
                    ("all_reduce", lambda t, g: dist.all_reduce(t, group=g)),
                    ("broadcast", lambda t, g: dist.broadcast(t, src=P - 1, group=g)),
                    ("reduce", lambda t, g: dist.reduce(t, dst=0, group=g))):
                mine, ref = shaped(kind, (4, 3), 1), shaped(kind, (4, 3), 1).contiguous()
                run(mine, None)
                run(ref, gloo)
                assert not mine.is_contiguous()
                if name != "reduce" or r == 0:  # (a reduce leaves other ranks' tensors undefined)
                    _cmp(f"{name} {kind}", mine, ref, False, steps=P)
            t = shaped(kind, (4, 3), 2)
            outs, refs = [shaped(kind, (4, 3), 3) for _ in range(P)], [torch.zeros(4, 3) for _ in range(P)]
            dist.all_gather(outs, t)
            dist.all_gather(refs, t.contiguous(), group=gloo)
            for o, ref in zip(outs, refs):
                _cmp(f"all_gather {kind}", o, ref, True)
            out, ref = shaped(kind, (4 * P, 3), 4), torch.zeros(4 * P, 3)
            dist.all_gather_into_tensor(out, shaped(kind, (4, 3), 5))
            dist.all_gather_into_tensor(ref, shaped(kind, (4, 3), 5).contiguous(), group=gloo)
            _cmp(f"all_gather_into_tensor {kind}", out, ref, True)
            out, ref = shaped(kind, (4, 3), 6), torch.zeros(4, 3)
            dist.reduce_scatter_tensor(out, shaped(kind, (4 * P, 3), 7))
            dist.reduce_scatter_tensor(ref, shaped(kind, (4 * P, 3), 7).contiguous(), group=gloo)
            _cmp(f"reduce_scatter_tensor {kind}", out, ref, False, steps=P)
            out, ref = shaped(kind, (4, 3), 8), torch.zeros(4, 3)
            blocks = [shaped(kind, (4, 3), 9 + i) for i in range(P)] if r == 0 else None
            dist.scatter(out, blocks, src=0)
            dist.scatter(ref, [b.contiguous() for b in blocks] if r == 0 else None, src=0, group=gloo)
            _cmp(f"scatter {kind}", out, ref, True)
            gl = [shaped(kind, (4, 3), 20) for _ in range(P)] if r == 0 else None
            gref = [torch.zeros(4, 3) for _ in range(P)] if r == 0 else None
            dist.gather(shaped(kind, (4, 3), 21), gl, dst=0)
            dist.gather(shaped(kind, (4, 3), 21).contiguous(), gref, dst=0, group=gloo)
            for a, b in zip(gl or [], gref or []):
                _cmp(f"gather {kind}", a, b, True)
    assert not seen, f"handed to the Python backend: {seen}"
    return True


def case_call_timeout(comm):
    """A call whose peer never comes raises within torch's per-call timeout (opts.timeout), not the
    group's (10 minutes here: the pool's call timeout would fire first), naming the rank and the
    collective: dist.barrier(timeout=), an all_reduce through the group's own method with
    AllreduceOptions.timeout, and an all_to_all_single with split sizes with AllToAllOptions.timeout
    (the core's numbered all_to_allv: its error names all_to_all #n). Rank 0 calls, the others stay
    away until it has raised."""
    setup(comm)
    P, r = comm.size, comm.rank
    messages = []
    names = ("barrier", "all_reduce", "all_to_all")
    for name in names:
        g = dist.new_group(backend="commlib", timeout=datetime.timedelta(minutes=10))
        if r == 0:
            try:
                if name == "barrier":
                    dist.barrier(group=g, timeout=datetime.timedelta(seconds=1))
                elif name == "all_to_all":
                    opts = dist.AllToAllOptions()
                    opts.timeout = datetime.timedelta(seconds=1)
                    splits = [j + 1 for j in range(P)]  # (uneven: the core's all_to_allv)
                    g.alltoall_base(torch.zeros(sum(splits)), torch.ones(sum(splits)), splits, splits,
                                    opts).wait()
                else:
                    opts = dist.AllreduceOptions()
                    opts.timeout = datetime.timedelta(seconds=1)
                    g.allreduce([torch.ones(3)], opts).wait()
                messages.append(f"{name}: no error")
            except Exception as e:  # noqa: BLE001 - checked below
                messages.append(f"{type(e).__name__}: {e}")
        comm.barrier()  # the pool's communicator: the others wait here until rank 0 raised
        dist.destroy_process_group(g)
    if r == 0:
        for name, msg in zip(names, messages):
            assert msg.startswith("PeerError") and name in msg and "call's timeout (1 s)" in msg, msg
            assert any(f"rank {p} did not answer" in msg for p in range(1, P)), msg
        assert "all_to_all #" in messages[2] and "send #" not in messages[2], messages[2]
    return messages
