"""Issue 41's payoff, measured: compressed collectives on a real rate-limited link between network
namespaces (docs/compression.md; results in bench/RESULTS_compression.md).

    python bench/compress_netns.py [--rate 1gbit] [--sizes 16M,64M,256M] [--codecs int8,int4,int8:inter]
                                   [--algorithms hierarchical,ring,auto]
                                   [--steps 60] [--out bench/results/compression] [--skip-allreduce]
                                   [--skip-training]

Root only. Two parts, each on two namespaces ("hosts") of 2 ranks, joined by veth links with
``tc tbf`` at ``--rate`` (commlib.testing.netns / scripts/netns.sh, as the multi-host benchmarks;
everything is removed on the way out, also on failure):

1. all_reduce of float32 at ``--sizes`` per codec against uncompressed: ``commlib bench all_reduce
   --np 4 --hosts 2 --netns --compress ...`` (hierarchical, ring and auto; its report, with the
   "Compressed collectives" section, goes to OUT/report).
2. training: the project's GPT (commlib.models.gpt.TinyGPT, byte-level, larger than the tests') on a
   text corpus already on this disk (the licence texts in /usr/share/common-licenses; no download)
   for ``--steps`` Adam steps with DataParallel, uncompressed and with each codec + error feedback,
   in the same processes, from the same initial weights and batches: per-step loss and wall-clock,
   the held-out loss at the end, and the wall-clock to reach the uncompressed run's final loss
   (OUT/training.json, OUT/training_loss.png).

The machine's load average is recorded with the results: on a shared machine absolute times are
noisy, ratios of the same run less so.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CORPUS_GLOB = "/usr/share/common-licenses/*"
MODEL = dict(vocab=256, d_model=128, n_heads=4, n_layers=4, max_seq=64, seed=0)
# (SGD at lr 0.3 with momentum 0.9, the first choice, diverged to a loss of 280 in 40 steps)
ROWS_PER_RANK, SEQ, LR = 8, 64, 2e-3


def corpus() -> bytes:
    """The licence texts on this disk, concatenated in name order (symlinks skipped: duplicates)."""
    paths = sorted(p for p in glob.glob(CORPUS_GLOB) if os.path.isfile(p) and not os.path.islink(p))
    if not paths:
        raise SystemExit(f"compress_netns: no corpus at {CORPUS_GLOB}")
    return b"\n".join(open(p, "rb").read() for p in paths)


def train_rank(comm, data: bytes, codec, steps: int, seed: int = 7):
    """One rank's run: (losses, step end times since start, held-out loss)."""
    import torch

    from commlib.models import gpt
    from commlib.parallel import DataParallel
    torch.set_num_threads(1)
    arr = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    split = int(len(arr) * 0.9)
    train, held = arr[:split], arr[split:]
    cfg = gpt.GPTConfig(**MODEL)
    dp = DataParallel(gpt.TinyGPT(cfg), comm, compress=codec, error_feedback=codec is not None)
    opt = torch.optim.Adam(dp.parameters(), lr=LR)
    g = torch.Generator().manual_seed(seed)
    P = comm.size

    def batch(src, rows):
        starts = torch.randint(0, len(src) - SEQ - 1, (rows,), generator=g)
        x = torch.stack([src[s:s + SEQ + 1] for s in starts])
        return x[:, :-1], x[:, 1:]

    comm.barrier()
    # the same draw on every rank: one generator, seeded alike
    losses, times = gpt.train_data_parallel(dp, opt, comm, (batch(train, ROWS_PER_RANK * P) for _ in range(steps)),
                                            ROWS_PER_RANK)
    with torch.no_grad():
        tokens, targets = batch(held, 64)
        held_loss = float(dp.module(tokens, targets))
    return losses, times, held_loss


def run_training(net, args, out):
    from commlib.testing.netns import NetnsRankPool
    data = corpus()
    variants = [None] + [c.partition(":")[0] for c in args.codecs if ":" not in c]
    results = {}
    # the ranks import this file by its name (a function of __main__ is not theirs to find)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    rank_fn = __import__("compress_netns").train_rank
    pool = NetnsRankPool(net, [0, 0, 1, 1], timeout=120)
    try:
        for v in variants:
            per_rank = pool.run(rank_fn, data, v, args.steps, timeout=3600)
            losses, times, held = per_rank[0]
            results[v or "uncompressed"] = {"losses": losses, "times_s": [max(t[1][i] for t in per_rank)
                                                                         for i in range(len(losses))],
                                            "held_out_loss": held}
            print(f"# training {v or 'uncompressed'}: final loss {np.mean(losses[-5:]):.4f}, "
                  f"{results[v or 'uncompressed']['times_s'][-1]:.1f} s", flush=True)
    finally:
        pool.close()
    target = summarize(results)
    info = {"corpus": CORPUS_GLOB, "corpus_bytes": len(data), "model": MODEL, "rows_per_rank": ROWS_PER_RANK,
            "seq": SEQ, "optimizer": "Adam", "lr": LR, "steps": args.steps, "rate": args.rate, "target_loss": target,
            "load_average": os.getloadavg(), "results": results}
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(info, f, indent=1)
    plot_training(info, os.path.join(out, "training_loss.png"))


def summarize(results: dict) -> float:
    """Adds each run's final loss (mean of its last 5 steps) and its wall-clock to the uncompressed
    run's final loss (the first step whose 5-step mean is at most it; None: never); returns it."""
    smooth = {n: np.convolve(r["losses"], np.ones(5) / 5, mode="valid") for n, r in results.items()}
    target = float(smooth["uncompressed"][-1])
    for name, r in results.items():
        hit = np.nonzero(smooth[name] <= target * (1 + 1e-12))[0]
        r["final_loss"] = float(smooth[name][-1])
        r["seconds_to_target"] = float(r["times_s"][hit[0] + 4]) if hit.size else None
    return target


def plot_training(info, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in info["results"].items():
        a.plot(range(1, len(r["losses"]) + 1), r["losses"], label=name, lw=1.2)
        b.plot(r["times_s"], r["losses"], label=name, lw=1.2)
    a.set_xlabel("step")
    b.set_xlabel("wall-clock (s)")
    for ax in (a, b):
        ax.set_ylabel("training loss (nats/byte)")
        ax.legend(fontsize=8)
    fig.suptitle(f"TinyGPT on {info['corpus_bytes']} bytes of licence texts, 2 hosts x 2 ranks at {info['rate']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_allreduce(args, out):
    argv = [sys.executable, "-m", "commlib", "bench", "all_reduce", "--np", "4", "--hosts", "2", "--netns",
            "--rate", args.rate, "-b", args.sizes[0], "-e", args.sizes[-1], "-f", "4",
            "--algorithms", args.algorithms, "--compress", ",".join(args.codecs), "--peers", "none",
            "--passes", "1", "--mode", "out", "-n", "3", "-w", "1", "--min-time", "0",
            "--json", os.path.join(out, "allreduce.json"), "--report", os.path.join(out, "report")]
    print("# " + " ".join(argv[1:]), flush=True)
    subprocess.run(argv, check=True, cwd=ROOT)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--sizes", default="16M,64M,256M")
    p.add_argument("--codecs", default="int8,int4,int8:inter,int4:inter")
    p.add_argument("--algorithms", default="hierarchical,ring,auto",
                   help="all_reduce algorithms timed raw and with each codec (a loaded machine: fewer)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "compression"))
    p.add_argument("--skip-allreduce", action="store_true")
    p.add_argument("--skip-training", action="store_true")
    args = p.parse_args(argv)
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.codecs = [c for c in args.codecs.split(",") if c]
    os.makedirs(args.out, exist_ok=True)
    print(f"# load average at start: {os.getloadavg()}", flush=True)
    if not args.skip_allreduce:
        run_allreduce(args, args.out)
    if not args.skip_training:
        from commlib.testing.netns import Namespaces
        with Namespaces(2, rate=args.rate) as net:
            run_training(net, args, args.out)
    print(f"# load average at end: {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
