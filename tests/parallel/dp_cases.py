"""Rank-side functions for the data-parallel tests (run by commlib.testing rank pools).

Import this module as ``parallel.dp_cases`` (tests/ is on the workers' sys.path), so that the
functions' ``__module__`` resolves in the rank processes.

Equivalence tolerance: every parallel run is compared with single-process training on the full
batch, computed inside the rank function from the same seed. Each data-parallel rank computes the
mean loss on its own B/P rows and the gradients are averaged, which equals the full-batch mean
gradient mathematically but sums the B rows in a different order (per-rank partial sums, then the
collective's reduction order). fp32 rounding then differs in the last bits (~1e-7 relative per
step); over 10 steps with SGD+momentum or AdamW these stay far below the 1e-5 relative bound we
assert, measured per tensor as max|a - b| / max|b|. (The transformer's qkv projection has no bias:
a key bias has an exactly-zero true gradient, so AdamW would normalise pure rounding noise into
full-size steps and no tolerance would be meaningful for it.) Where the reduction order is
reproducible (a parameter server with a single worker) the test asserts bitwise equality.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

TOL = 1e-5
BATCH = 12          # divisible by 2, 3 and 4 ranks (and by 1, 2, 3 parameter-server workers)
STEPS = 10


# -- models ---------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, d_in=8, hidden=16, d_out=4):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and a GELU MLP."""

    def __init__(self, d=16, heads=2, ff=32):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)  # a key bias has an exactly-zero gradient
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ff)
        self.fc2 = nn.Linear(ff, d)

    def forward(self, x):
        B, T, D = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.reshape(B, T, h, D // h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D // h)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, d_in=8, d=16, d_out=4, blocks=1):
        super().__init__()
        self.embed = nn.Linear(d_in, d)
        self.blocks = nn.Sequential(*[Block(d) for _ in range(blocks)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, d_out)

    def forward(self, x):
        return self.head(self.ln_f(self.blocks(self.embed(x))))


def make_model(name, seed=0):
    torch.manual_seed(seed)
    if name == "mlp":
        return MLP()
    if name == "transformer":
        return Transformer()
    if name == "transformer2":
        return Transformer(blocks=2)
    raise ValueError(name)


def make_optimizer(name, params):
    if name == "mlp":
        return torch.optim.SGD, dict(lr=0.05, momentum=0.9)
    return torch.optim.AdamW, dict(lr=1e-3, weight_decay=0.01)


def batch(name, step, n=BATCH):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(n, 8, generator=g) if name == "mlp" else torch.randn(n, 5, 8, generator=g)
    y = torch.randn(n, 4, generator=g) if name == "mlp" else torch.randn(n, 5, 4, generator=g)
    return x, y


def shard(t, rank, parts):
    n = t.shape[0] // parts
    return t[rank * n:(rank + 1) * n]


def loss_fn(out, y):
    return F.mse_loss(out.float(), y)


@functools.lru_cache(maxsize=8)
def reference(name, steps=STEPS, n=BATCH):
    """Single-process training on the full batch: parameters after every step (cached per rank
    process; callers must not modify the returned tensors)."""
    torch.manual_seed(0)
    model = make_model(name)
    cls, kw = make_optimizer(name, None)
    opt = cls(model.parameters(), **kw)
    states = []
    for s in range(steps):
        x, y = batch(name, s, n)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return states


def rel_err(state, ref) -> float:
    worst = 0.0
    for k, r in ref.items():
        a = state[k].detach().float().cpu()
        d = (a - r.float()).abs().max().item()
        worst = max(worst, d / max(r.float().abs().max().item(), 1e-12))
    return worst


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# -- training under each method -------------------------------------------------------------------
def _setup(comm, method, name, same_init=False, device="cpu", **kw):
    import commlib.parallel as par
    # different init per rank: the wrappers must broadcast rank 0's (the server's) parameters
    model = make_model(name, seed=0 if same_init else comm.rank).to(device)
    cls, okw = make_optimizer(name, None)
    if method == "dp":
        wrapped = par.DataParallel(model, comm, bucket_cap_mb=kw.pop("bucket_cap_mb", 0.001), **kw)
        opt = cls(wrapped.parameters(), **okw)
        state = lambda: model.state_dict()  # noqa: E731
        params = lambda: list(model.parameters())  # noqa: E731
    elif method in ("zero1", "zero2"):
        wrapped = model
        opt = par.ZeroOptimizer(cls, model.parameters(), comm, stage=int(method[-1]),
                            bucket_cap_mb=kw.pop("bucket_cap_mb", 0.001), **kw, **okw)
        state = lambda: model.state_dict()  # noqa: E731
        params = lambda: list(model.parameters())  # noqa: E731
    elif method == "zero3":
        wrapped = par.FullyShardedModule(model, comm, **kw)
        opt = cls(wrapped.parameters(), **okw)
        state = lambda: wrapped.full_state_dict()  # noqa: E731
        params = lambda: list(state().values())  # noqa: E731
    elif method == "ps":
        wrapped = model
        opt = par.ParameterServer(model, comm, cls, **kw, **okw)
        state = lambda: model.state_dict()  # noqa: E731
        params = lambda: list(model.parameters())  # noqa: E731
    else:
        raise ValueError(method)
    return wrapped, opt, state, params


def data_rank(comm, method, kw):
    """(index, parts) of this rank's slice of the batch."""
    if method == "ps" and not kw.get("server_computes", True):
        server = kw.get("server_rank", 0)
        if comm.rank == server:
            return None, comm.size - 1
        return comm.rank - (comm.rank > server), comm.size - 1
    return comm.rank, comm.size


def train_equivalence(comm, method, name, steps=STEPS, device="cpu", **kw):
    """Train ``steps`` steps on ``device``; return per-step (relative error vs the CPU reference,
    parameter digest)."""
    torch.set_num_threads(1)
    ref = reference(name, steps)
    model, opt, state, params = _setup(comm, method, name, device=device, **dict(kw))
    kw.pop("same_init", None)
    idx, parts = data_rank(comm, method, kw)
    errs, digests = [], []
    for s in range(steps):
        x, y = (t.to(device) for t in batch(name, s))
        opt.zero_grad()
        if idx is not None:
            loss_fn(model(shard(x, idx, parts)), shard(y, idx, parts)).backward()
        opt.step()
        errs.append(rel_err(state(), ref[s]))
        digests.append(digest(params()))
    return {"errs": errs, "digests": digests}


def no_sync_accumulation(comm, micro=4):
    """4 micro-batches under no_sync (last one synchronised) vs one large batch."""
    from commlib.parallel import DataParallel
    torch.set_num_threads(1)
    name = "mlp"
    ref = reference(name, 3, n=48)
    model = DataParallel(make_model(name, seed=comm.rank), comm, bucket_cap_mb=0.001)
    cls, okw = make_optimizer(name, None)
    opt = cls(model.parameters(), **okw)
    errs, digests = [], []
    for s in range(3):
        x, y = batch(name, s, n=48)
        x, y = shard(x, comm.rank, comm.size), shard(y, comm.rank, comm.size)
        opt.zero_grad()
        xs, ys = x.chunk(micro), y.chunk(micro)
        for m in range(micro):
            ctx = model.no_sync() if m < micro - 1 else contextlib.nullcontext()
            with ctx:
                (loss_fn(model(xs[m]), ys[m]) / micro).backward()
        opt.step()
        errs.append(rel_err(model.module.state_dict(), ref[s]))
        digests.append(digest(model.parameters()))
    return {"errs": errs, "digests": digests}


def no_sync_is_local(comm):
    """Inside no_sync gradients are not communicated: they differ across ranks."""
    from commlib.parallel import DataParallel
    model = DataParallel(make_model("mlp"), comm)
    x, y = batch("mlp", 0)
    with model.no_sync():
        loss_fn(model(shard(x, comm.rank, comm.size)), shard(y, comm.rank, comm.size)).backward()
    return digest([p.grad for p in model.parameters()])


def overlap_stats(comm):
    """Bucket launch times vs the time the last gradient became ready."""
    from commlib.parallel import DataParallel
    torch.set_num_threads(1)
    model = DataParallel(make_model("transformer2"), comm, bucket_cap_mb=0.002)
    x, y = batch("transformer", 0)
    out = []
    for _ in range(2):
        model.zero_grad()
        loss_fn(model(x), y).backward()
        out.append(dict(model.last_backward_stats))
    return out


def unused_params(comm, find_unused):
    """A parameter unused on every rank keeps grad None with find_unused_parameters; one used
    on rank 0 only gets rank 0's gradient averaged (divided by size)."""
    from commlib.parallel import DataParallel

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)   # used on rank 0 only
            self.c = nn.Linear(4, 4)   # never used

        def forward(self, x, use_b):
            x = self.a(x)
            return self.b(x) if use_b else x

    torch.manual_seed(0)
    m = DataParallel(M(), comm, find_unused_parameters=find_unused, bucket_cap_mb=0.0001)
    x = torch.ones(2, 4)
    m(x, comm.rank == 0).sum().backward()
    mod = m.module
    return {"c_none": mod.c.weight.grad is None,
            "b_grad": None if mod.b.weight.grad is None else mod.b.weight.grad.sum().item(),
            "a_grad": mod.a.weight.grad.sum().item()}


def bad_inputs(comm):
    """Argument errors; returns the messages (every rank raises the same)."""
    from commlib.parallel import DataParallel, FullyShardedModule, ParameterServer, ZeroOptimizer
    msgs = {}

    def catch(key, fn):
        try:
            fn()
        except (TypeError, ValueError) as e:
            msgs[key] = f"{type(e).__name__}: {e}"
        else:
            msgs[key] = None

    torch.manual_seed(0)
    d_in = 8 if comm.rank == 0 else 9
    catch("shape", lambda: DataParallel(nn.Sequential(nn.Linear(d_in, 4)), comm))
    catch("count", lambda: DataParallel(
        nn.Sequential(*[nn.Linear(4, 4) for _ in range(1 + (comm.rank == comm.size - 1))]), comm))
    catch("cap", lambda: DataParallel(nn.Linear(2, 2), comm, bucket_cap_mb=0))
    catch("module", lambda: DataParallel("not a module", comm))
    catch("comm", lambda: DataParallel(nn.Linear(2, 2), object()))
    catch("zero_stage", lambda: ZeroOptimizer(torch.optim.SGD, nn.Linear(2, 2).parameters(), comm,
                                              stage=3, lr=0.1))
    catch("zero_cls", lambda: ZeroOptimizer("sgd", nn.Linear(2, 2).parameters(), comm, lr=0.1))
    catch("zero_empty", lambda: ZeroOptimizer(torch.optim.SGD, [], comm, lr=0.1))
    catch("fsdp_mp", lambda: FullyShardedModule(nn.Linear(2, 2), comm, mixed_precision="fp8"))
    catch("algorithm", lambda: DataParallel(nn.Linear(2, 2), comm, algorithm="no_such_algo"))
    catch("ps_root", lambda: ParameterServer(nn.Linear(2, 2), comm, torch.optim.SGD,
                                             server_rank=comm.size, lr=0.1))
    return msgs


# -- memory ---------------------------------------------------------------------------------------
def memory_report(comm, method, d=64):
    """Per-rank bytes for params, grads and optimizer state after one AdamW step, and Ψ."""
    import commlib.parallel as par
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Transformer(d_in=8, d=d, blocks=2)
    psi = sum(p.numel() for p in model.parameters())
    x, y = batch("transformer", 0)
    x, y = shard(x, comm.rank, comm.size), shard(y, comm.rank, comm.size)
    if method == "dp":
        m = par.DataParallel(model, comm)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        mem = lambda: m.memory_breakdown(opt)  # noqa: E731
    elif method in ("zero1", "zero2"):
        m = model
        opt = par.ZeroOptimizer(torch.optim.AdamW, model.parameters(), comm, stage=int(method[-1]),
                                lr=1e-3)
        mem = opt.memory_breakdown
    elif method in ("zero3", "zero3_bf16"):
        m = par.FullyShardedModule(model, comm, mixed_precision="bf16" if "bf16" in method else None)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        mem = lambda: m.memory_breakdown(opt)  # noqa: E731
    elif method == "ps":
        m = model
        opt = par.ParameterServer(model, comm, torch.optim.AdamW, lr=1e-3)
        mem = opt.memory_breakdown
    for _ in range(2):
        opt.zero_grad()
        loss_fn(m(x), y).backward()
        opt.step()
    out = mem()
    out["psi"] = psi
    return out


# -- assertions used by the test modules (run in the pytest process) -----------------------------
def assert_equivalent(results, tol=TOL, what=""):
    """Every rank within ``tol`` of the reference at every step, and bitwise-equal parameters
    across ranks after every step."""
    for r, res in enumerate(results):
        worst = max(res["errs"])
        assert worst <= tol, f"{what}: rank {r} deviates from single-process training by " \
                             f"{worst:.3g} relative (> {tol:g}); per step: {res['errs']}"
    for r, res in enumerate(results[1:], start=1):
        for s, (a, b) in enumerate(zip(results[0]["digests"], res["digests"])):
            assert a == b, f"{what}: parameters on rank {r} differ from rank 0 after step {s}"
