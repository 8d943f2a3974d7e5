"""Rank side of test_torch_fast_path.py: the torch backend's latency path (commlib/torch/fast_path.py).

Every blocking collective that has a latency path is run twice on the same data: blocking (which
must take the latency path: the backend's ``fast_collective`` is wrapped to record what it answered)
and with ``async_op=True`` + ``wait()`` (the general path: staging, the worker, the completion
thread). Both run the same algorithm, so results must be bitwise equal, for every dtype.

The C++ backend (commlib/torch/native.py) serves the default group's CPU calls itself, so these
cases run on a group of the Python backend alone, made the default group while they run
(``python_world``): the Python backend still serves what the C++ one hands it, and every group
where commlib._C_torch is not built.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

import backend_cases as bc
import commlib._C as _C
import commlib.torch.backend as backend_mod
import commlib.torch.data_movement as dm_mod
from commlib.torch import native


@contextlib.contextmanager
def python_world(comm):
    """The default group replaced by a Python-backend group over the same ranks meanwhile."""
    st = bc.setup(comm)
    if "python_world" not in st:
        wrap = native.wrap
        native.wrap = lambda group: group  # this one group: the Python backend as it is
        try:
            st["python_world"] = dist.new_group(backend="commlib")
        finally:
            native.wrap = wrap
    c10d = dist.distributed_c10d
    world = c10d._world.default_pg
    c10d._world.default_pg = st["python_world"]
    try:
        yield
    finally:
        c10d._world.default_pg = world

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64, torch.uint8)


class _Recorder:
    """Wraps ``fast_collective`` in the backend modules; ``answers`` lists what it returned there.
    ``offers`` and ``taken`` count every call of the C++ entry meanwhile, the communicator's own
    included, and those it did not decline (``_C.fast_path_counts``)."""

    def __init__(self):
        self.answers = []
        self._real = backend_mod.fast_collective
        self._start = (0, 0)
        self.offers = self.taken = 0

    def __call__(self, *args):
        r = self._real(*args)
        self.answers.append("fast" if r is None else "declined")
        return r

    def __enter__(self):
        backend_mod.fast_collective = dm_mod.fast_collective = self
        self._start = _C.fast_path_counts()
        return self

    def __exit__(self, *exc):
        offers, declined = _C.fast_path_counts()
        self.offers = offers - self._start[0]
        self.taken = self.offers - (declined - self._start[1])
        backend_mod.fast_collective = dm_mod.fast_collective = self._real


def _data(n, dtype, rank, salt):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    hi = 4 if dtype == torch.uint8 else 50
    return torch.randint(0, hi, (n,), generator=g).to(dtype)


def _calls(P, me, n, dtype):
    """(name, make) pairs: ``make(salt)`` -> (run(async_op) -> None, outputs to compare)."""
    def ar(op):
        def make(salt):
            t = _data(n, dtype, me, salt)
            return (lambda a: dist.all_reduce(t, op=op, async_op=a)), [t]
        return make

    def bc_(root):
        def make(salt):
            t = _data(n, dtype, me, salt)
            return (lambda a: dist.broadcast(t, src=root, async_op=a)), [t]
        return make

    def red(root, op):
        def make(salt):
            t = _data(n, dtype, me, salt)
            return (lambda a: dist.reduce(t, dst=root, op=op, async_op=a)), [t]
        return make

    def ag(stacked):
        def make(salt):
            x = _data(n, dtype, me, salt)
            out = torch.zeros((P, n) if stacked else (P * n,), dtype=dtype)
            return (lambda a: dist.all_gather_into_tensor(out, x, async_op=a)), [out, x]
        return make

    def rs(op):
        def make(salt):
            x = _data(P * n, dtype, me, salt)
            out = torch.zeros(n, dtype=dtype)
            return (lambda a: dist.reduce_scatter_tensor(out, x, op=op, async_op=a)), [out, x]
        return make

    def a2a(make_salt):
        x = _data(P * n, dtype, me, make_salt)
        out = torch.zeros(P * n, dtype=dtype)
        return (lambda a: dist.all_to_all_single(out, x, async_op=a)), [out, x]

    def a2a_in_place(make_salt):  # output is input: the core copies the input aside first
        x = _data(P * n, dtype, me, make_salt)
        return (lambda a: dist.all_to_all_single(x, x, async_op=a)), [x]

    def barrier(salt):
        return (lambda a: dist.barrier(async_op=a)), []

    ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN]
    if not dtype.is_floating_point:
        ops.append(dist.ReduceOp.BOR)
    else:
        ops.append(dist.ReduceOp.AVG)
    out = [(f"all_reduce {op}", ar(op)) for op in ops]
    out += [(f"broadcast root {r}", bc_(r)) for r in range(P)]
    out += [(f"reduce root {r} {op}", red(r, op)) for r in range(P) for op in ops[:2]]
    out += [("all_gather_into_tensor", ag(False)), ("all_gather_into_tensor stacked", ag(True))]
    out += [(f"reduce_scatter_tensor {op}", rs(op)) for op in ops[:2]]
    out += [("all_to_all_single", a2a), ("all_to_all_single in place", a2a_in_place),
            ("barrier", barrier)]
    return out


def case_fast_matches_general(comm, dtype_names=None, sizes=(1, 5, 1000)):
    """Every latency-path call: taken when blocking, declined never; bitwise equal to the general
    path (async + wait) on the same inputs. Returns a list of failures (empty: all good)."""
    with python_world(comm):
        return _fast_matches_general(comm, dtype_names, sizes)


def _fast_matches_general(comm, dtype_names, sizes):
    P, me = comm.size, comm.rank
    failures = []
    dtypes = DTYPES if dtype_names is None else [getattr(torch, d) for d in dtype_names]
    for dtype in dtypes:
        for n in sizes:
            for salt, (name, make) in enumerate(_calls(P, me, n, dtype)):
                what = f"{name} {dtype} n={n}"
                run_fast, outs_fast = make(salt)
                with _Recorder() as rec:
                    run_fast(False)
                if rec.answers != ["fast"] or (rec.offers, rec.taken) != (1, 1):
                    failures.append(f"{what}: latency path answered {rec.answers} "
                                    f"({rec.offers} offers in all, {rec.taken} taken)")
                run_gen, outs_gen = make(salt)
                with _Recorder() as rec:
                    w = run_gen(True)
                    w.wait()
                if "fast" in rec.answers:
                    failures.append(f"{what}: async call took the latency path")
                # The general path's call into the communicator runs from its C++ entry, async ones
                # included (issue #37, session 26: csrc/bindings/fast_call.cc run_host).
                if rec.taken < 1:
                    failures.append(f"{what}: async call: the communicator's C++ entry did not run it")
                for i, (f, g) in enumerate(zip(outs_fast, outs_gen)):
                    if f.dtype != g.dtype or not torch.equal(f, g):
                        failures.append(f"{what}: output {i} differs between the paths")
    return failures


def case_declined_calls_take_the_general_path(comm):
    """What the latency path must decline (the general path handles it), with the right results
    (computed here): non-contiguous tensors, dtypes the core does not move, PREMUL_SUM, split
    sizes; and what the general path hands the core once it staged them: an offer the
    communicator's latency path takes."""
    with python_world(comm):
        return _declined_calls(comm)


def _declined_calls(comm):
    P, me = comm.size, comm.rank
    ranks_sum = P * (P - 1) // 2
    failures = []

    def check(name, run, got, want, answers=("declined",), offers=2, taken=1):
        with _Recorder() as rec:
            run()
        if rec.answers != list(answers):
            failures.append(f"{name}: the backend's latency path answered {rec.answers}")
        # The staged buffers (contiguous, a dtype the core moves, the op spelt out) are a new
        # offer, which the communicator's latency path takes: the general path alone costs
        # ~30-50 us more per call (docs/torch_backend.md, "Cost of a call").
        if (rec.offers, rec.taken) != (offers, taken):
            failures.append(f"{name}: {rec.offers} offers to fast_collective, {rec.taken} taken; "
                            f"expected {offers}, {taken}")
        if got.dtype != want.dtype or not torch.equal(got, want):
            failures.append(f"{name}: {got.tolist()} != {want.tolist()}")

    grid = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    a = (grid + me).t()  # a transposed view: not contiguous
    check("all_reduce non-contiguous", lambda: dist.all_reduce(a), a, (grid * P + ranks_sum).t())
    a = torch.arange(6, dtype=torch.int16) + me
    check("broadcast int16", lambda: dist.broadcast(a, src=P - 1), a,
          torch.arange(6, dtype=torch.int16) + P - 1)
    a = torch.arange(6, dtype=torch.float64) + me
    op = dist._make_nccl_premul_sum(0.5)
    check("all_reduce premul_sum", lambda: dist.all_reduce(a, op=op), a,
          (torch.arange(6, dtype=torch.float64) * P + ranks_sum) * 0.5)
    x = torch.arange(P * P, dtype=torch.int64) + 100 * me
    out = torch.zeros(P * P, dtype=torch.int64)
    want = torch.cat([torch.arange(me * P, me * P + P, dtype=torch.int64) + 100 * r for r in range(P)])
    # split sizes: the backend does not offer it; equal blocks, so the communicator's offer takes it
    check("all_to_all_single with split sizes",
          lambda: dist.all_to_all_single(out, x, [P] * P, [P] * P), out, want, answers=(), offers=1)
    # Two tensors in one blocking call (torch's contract for a list, several.py: this rank's two
    # reduced here, then one all_reduce across ranks into both): the backend's latency path is not
    # offered them; the communicator's takes the one call.
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    pair = [torch.arange(4, dtype=torch.int32) + me, torch.arange(4, dtype=torch.int32) * 2 + me]
    opts = dist.AllreduceOptions()
    opts.asyncOp = False  # torch's default is True
    with _Recorder() as rec:
        backend.allreduce(pair, opts).wait()
    if rec.answers or (rec.offers, rec.taken) != (1, 1):
        failures.append(f"blocking all_reduce of two tensors: backend answers {rec.answers}, "
                        f"{rec.offers} offers, {rec.taken} taken, expected none, 1 and 1")
    want = torch.arange(4, dtype=torch.int32) * 3 * P + 2 * ranks_sum
    if not (torch.equal(pair[0], want) and torch.equal(pair[1], want)):
        failures.append(f"blocking all_reduce of two tensors: {pair}, expected {want} in both")
    # Called without options (torch always passes them; a direct caller need not): every gather
    # form's default options exist (torch.distributed has no AllgatherOptions).
    x = torch.arange(3, dtype=torch.int32) + 10 * me
    gathered = torch.cat([torch.arange(3, dtype=torch.int32) + 10 * r for r in range(P)])
    flat, pair, lists = torch.zeros(3 * P, dtype=torch.int32), [torch.zeros(3 * P, dtype=torch.int32)], \
        [[torch.zeros(3, dtype=torch.int32) for _ in range(P)]]
    backend._allgather_base(flat, x).wait()
    backend.allgather_into_tensor_coalesced(pair, [x]).wait()
    backend.allgather(lists, [x]).wait()
    for name, got in (("_allgather_base", flat), ("allgather_into_tensor_coalesced", pair[0]),
                      ("allgather", torch.cat(lists[0]))):
        if not torch.equal(got, gathered):
            failures.append(f"{name} without options: {got.tolist()} != {gathered.tolist()}")
    # empty blocks (the finalizers' offsets step by zero)
    outs = [torch.full((0,), -1.0) for _ in range(P)]
    with _Recorder():
        dist.all_gather(outs, torch.ones(0))
        dist.gather(torch.ones(0), outs if me == 0 else None, dst=0)
    if any(o.numel() for o in outs):
        failures.append("all_gather/gather of empty tensors changed their sizes")
    return failures
