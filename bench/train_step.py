"""Training-step benchmark: DataParallel, ZeRO-1/2/3 and ParameterServer on commlib versus torch
DDP over gloo, on one small transformer, at 2 and 4 ranks.

    python bench/train_step.py --np 2 4 --steps 8

Each (method, world size) runs in a fresh pool of rank processes (commlib.testing), so the RSS
figures of one method are not inflated by another. Reported per method: median step time
(forward + backward + optimizer step, including all communication), the ParameterServer's
push+pull time, per-rank bytes held for parameters, gradients and optimizer state (from the
tensors actually allocated; rank 0 — the server for ParameterServer — and, for ParameterServer,
a worker), communication buffers, and RSS (current and peak) of rank 0. Results go to
bench/RESULTS_data_parallel.md (``--out``).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

METHODS = ["ddp_gloo", "dp", "zero1", "zero2", "zero3", "zero3_bf16", "ps"]
LABELS = {"ddp_gloo": "torch DDP (gloo)", "dp": "DataParallel", "zero1": "ZeRO-1",
          "zero2": "ZeRO-2", "zero3": "ZeRO-3 (fp32)", "zero3_bf16": "ZeRO-3 (bf16 compute)",
          "ps": "ParameterServer"}


# -- rank side ------------------------------------------------------------------------------------
def _model(cfg):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d, heads, ff):
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, ff), nn.Linear(ff, d)

        def forward(self, x):
            B, T, D = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
            q, k, v = (t.reshape(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            d = cfg["d"]
            self.embed = nn.Embedding(cfg["vocab"], d)
            self.blocks = nn.Sequential(*[Block(d, cfg["heads"], 4 * d) for _ in range(cfg["layers"])])
            self.ln_f = nn.LayerNorm(d)
            self.head = nn.Linear(d, cfg["vocab"])

        def forward(self, idx):
            return self.head(self.ln_f(self.blocks(self.embed(idx))))

    torch.manual_seed(0)
    return Net()


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _setup(comm, method, cfg, port):
    """Build ``method``'s model and optimizer; return (module to call, optimizer, memory fn,
    list collecting push+pull times)."""
    import torch
    import commlib.parallel as par
    from commlib.parallel._buckets import optimizer_state_tensors, storage_bytes

    model = _model(cfg)
    Opt, okw = torch.optim.AdamW, {"lr": 1e-3}
    push_pull = []
    if method == "ddp_gloo":
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank,
                                    world_size=comm.size)
        net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cfg["bucket_mb"])
        opt = Opt(net.parameters(), **okw)

        def memory():
            return {"params": storage_bytes(model.parameters()),
                    "grads": storage_bytes(p.grad for p in model.parameters()),
                    "optimizer": storage_bytes(optimizer_state_tensors(opt)),
                    "comm_buffers": None}
    elif method == "dp":
        net = par.DataParallel(model, comm, bucket_cap_mb=cfg["bucket_mb"])
        opt = Opt(net.parameters(), **okw)
        memory = lambda: net.memory_breakdown(opt)  # noqa: E731
    elif method in ("zero1", "zero2"):
        net = model
        opt = par.ZeroOptimizer(Opt, model.parameters(), comm, stage=int(method[-1]),
                                bucket_cap_mb=cfg["bucket_mb"], **okw)
        memory = opt.memory_breakdown
    elif method in ("zero3", "zero3_bf16"):
        net = par.FullyShardedModule(model, comm,
                                     mixed_precision="bf16" if method.endswith("bf16") else None,
                                     wrap=lambda n, m: n.startswith("blocks.") or n in
                                     ("embed", "head", "ln_f"))
        opt = Opt(net.parameters(), **okw)
        memory = lambda: net.memory_breakdown(opt)  # noqa: E731
    elif method == "ps":
        net = model
        opt = par.ParameterServer(model, comm, Opt, **okw)
        memory = opt.memory_breakdown
        step = opt.step

        def timed_step():
            t = time.perf_counter()
            step()
            push_pull.append(time.perf_counter() - t)
        opt.step = timed_step
    else:
        raise ValueError(method)
    return net, opt, memory, push_pull


def rank_bench(comm, methods, cfg, port):
    """Time ``cfg['steps']`` steps of every method in ``methods``, interleaved round-robin (one
    step of each method per round, starting method rotated) so that all methods see the same
    machine load; return per-method timings and memory of this rank."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    setups, rss_delta = {}, {}
    for method in methods:
        before = _status_kb("VmRSS")
        setups[method] = _setup(comm, method, cfg, port)
        rss_delta[method] = _status_kb("VmRSS") - before
    g = torch.Generator().manual_seed(1 + comm.rank)
    B, T, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    times = {m: [] for m in methods}
    for s in range(cfg["warmup"] + cfg["steps"]):
        idx = torch.randint(0, V, (B, T), generator=g)
        tgt = torch.randint(0, V, (B, T), generator=g)
        order = methods[s % len(methods):] + methods[:s % len(methods)]
        for method in order:
            net, opt, _, _ = setups[method]
            comm.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            out = net(idx)
            loss = F.cross_entropy(out.float().reshape(-1, V), tgt.reshape(-1))
            loss.backward()
            opt.step()
            dt = time.perf_counter() - t0
            if s >= cfg["warmup"]:
                times[method].append(dt)
    res = {}
    for method in methods:
        net, opt, memory, push_pull = setups[method]
        res[method] = {"times": times[method], "psi": sum(p.numel() for p in _model(cfg).parameters()),
                       "mem": memory(), "push_pull": push_pull[cfg["warmup"]:],
                       "rss_delta": rss_delta[method]}
    res["_rss"] = _status_kb("VmRSS")
    res["_hwm"] = _status_kb("VmHWM")
    if "ddp_gloo" in methods:
        import torch.distributed as dist
        dist.destroy_process_group()
    return res


# -- driver ---------------------------------------------------------------------------------------
def _machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB RAM"
    except OSError:
        pass
    try:
        load = "load average %.1f %.1f %.1f" % os.getloadavg()
    except OSError:
        load = ""
    import torch
    return (f"{cpu}, {os.cpu_count()} logical CPUs, {mem}, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}, torch {torch.__version__}; "
            f"{load} at start (machine shared with other jobs)")


def _mib(b):
    return "n/a" if b is None else f"{b / 2**20:.2f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, nargs="+", default=[2, 4], help="world sizes")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per method")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--d", type=int, default=128, help="model width")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank")
    ap.add_argument("--bucket-mb", type=float, default=1.0)
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    ap.add_argument("--isolate", action="store_true",
                    help="also run each method alone in a fresh pool to measure its RSS")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "RESULTS_data_parallel.md"))
    args = ap.parse_args(argv)
    sys.path[:0] = [ROOT, os.path.join(ROOT, "bench")]  # this checkout's commlib; this module
    import importlib
    from commlib.bootstrap.ports import free_port
    from commlib.testing import RankPool
    me = importlib.import_module("train_step")  # a module the rank processes can import
    cfg = {"d": args.d, "layers": args.layers, "heads": args.heads, "vocab": args.vocab,
           "seq": args.seq, "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
           "bucket_mb": args.bucket_mb}
    machine = _machine()
    rows = []        # (world size, method, median step, per-rank results, isolated RSS or None)
    for n in args.np:
        t = time.time()
        pool = RankPool(n, timeout=900)
        try:
            res = pool.run(me.rank_bench, list(args.methods), cfg, free_port(), timeout=900)
        finally:
            pool.close()
        for method in args.methods:
            per_rank = [r[method] for r in res]
            med = statistics.median(statistics.median(r["times"]) for r in per_rank)
            rows.append([n, method, med, per_rank, None, res[0]["_rss"], res[0]["_hwm"]])
            print(f"np={n} {LABELS[method]:24s} median step {med * 1e3:8.1f} ms", flush=True)
        print(f"np={n}: {time.time() - t:.0f} s incl. start-up", flush=True)
        if args.isolate:
            for row in rows:
                if row[0] != n:
                    continue
                pool = RankPool(n, timeout=600)
                try:
                    iso = pool.run(me.rank_bench, [row[1]], dict(cfg, steps=2, warmup=1),
                                   free_port(), timeout=600)
                finally:
                    pool.close()
                row[4] = (iso[0]["_rss"], iso[0]["_hwm"])
                print(f"np={n} {LABELS[row[1]]:24s} isolated RSS {iso[0]['_rss'] / 2**20:.0f} MiB, "
                      f"peak {iso[0]['_hwm'] / 2**20:.0f} MiB", flush=True)
    psi = rows[0][3][0]["psi"]
    lines = [
        "# Training step: data parallelism on commlib vs torch DDP (gloo)",
        "",
        f"Generated by `python bench/train_step.py --np {' '.join(map(str, args.np))} "
        f"--steps {args.steps}{' --isolate' if args.isolate else ''}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        f"Machine: {machine}.",
        "",
        f"Model: decoder-only transformer, d={args.d}, {args.layers} blocks, {args.heads} heads, "
        f"vocab {args.vocab}, sequence {args.seq}, {args.batch} sequences per rank "
        f"(weak scaling); Ψ = {psi:,} parameters (fp32, {psi * 4 / 2**20:.2f} MiB); AdamW; "
        f"buckets {args.bucket_mb} MiB (also for torch DDP). A step is zero_grad + forward + "
        "backward + optimizer step, including all communication. All methods run in the same "
        "rank processes, interleaved round-robin (one step of each per round, rotating which "
        "goes first), so that they share the machine's load; the table gives the median over "
        f"ranks of each rank's median over {args.steps} steps (after {args.warmup} warm-up "
        "rounds) and the ratio to torch DDP over gloo measured in the same rounds. ZeRO-3 wraps "
        "each block, the embedding, the final norm and the head as units.",
        "",
        "Memory: per-rank bytes of parameters + gradients + optimizer state counted from the "
        "distinct storages actually allocated after the last step (rank 0; for ParameterServer "
        "rank 0 is the server and the worker's figure follows the slash), and the bucket / "
        "communication buffers held between steps (torch DDP's own buckets are not visible).",
    ]
    if args.isolate:
        lines += ["RSS: rank 0's resident set, current / peak, in a fresh pool running only that "
                  "method (the interpreter and torch are ~320 MiB of it; this model is small)."]
    lines += ["",
              "| ranks | method | step (ms) | vs DDP gloo | params+grads+optim (MiB) | × Ψ bytes | "
              "buffers (MiB) |" + (" RSS / peak (MiB) |" if args.isolate else ""),
              "| ---: | --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if args.isolate else "")]
    for n in args.np:
        base = next((r[2] for r in rows if r[0] == n and r[1] == "ddp_gloo"), None)
        for nn_, method, med, res, iso, _, _ in rows:
            if nn_ != n:
                continue
            m0 = res[0]["mem"]
            tot = m0["params"] + m0["grads"] + m0["optimizer"]
            tot_s, ratio_s = _mib(tot), f"{tot / psi:.1f}"
            if method == "ps":
                m1 = res[1]["mem"]
                tot1 = m1["params"] + m1["grads"] + m1["optimizer"]
                tot_s += f" / {_mib(tot1)}"
                ratio_s += f" / {tot1 / psi:.1f}"
            rel = f"{med / base:.2f}×" if base else "—"
            line = (f"| {n} | {LABELS[method]} | {med * 1e3:.1f} | {rel} | {tot_s} | {ratio_s} | "
                    f"{_mib(m0['comm_buffers'])} |")
            if args.isolate:
                line += f" {iso[0] / 2**20:.0f} / {iso[1] / 2**20:.0f} |" if iso else " |"
            lines.append(line)
    lines += ["", "Parameter server push + update + pull, timed on the server (reduce `direct` into "
              "the server, AdamW step, one send per worker):", "",
              "| ranks | push+update+pull (ms, median) | server traffic per step = 2(N-1)·4Ψ (MiB) |",
              "| ---: | ---: | ---: |"]
    for nn_, method, med, res, *_ in rows:
        if method == "ps" and res[0]["push_pull"]:
            pp = statistics.median(res[0]["push_pull"])
            lines.append(f"| {nn_} | {pp * 1e3:.1f} | {2 * (nn_ - 1) * 4 * psi / 2**20:.1f} |")
    lines += ["", "Expected per-rank bytes (fp32 Adam): DDP 16Ψ, ZeRO-1 8Ψ+8Ψ/N, ZeRO-2 4Ψ+12Ψ/N, "
              "ZeRO-3 16Ψ/N (also with bf16 compute: fp32 master, gradient and Adam shards), "
              "parameter server 16Ψ on the server and 8Ψ on the workers. The machine is shared "
              "and oversubscribed (4 ranks on 2 cores, other jobs running): absolute times are "
              "noise, the same-round ratios are the result.", ""]
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
