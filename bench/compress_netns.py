"""Issue 41's payoff, measured: compressed collectives on a real rate-limited link between network
namespaces (docs/compression.md; results in bench/RESULTS_compression.md).

    python bench/compress_netns.py [--rate 1gbit] [--sizes 16M,64M,256M] [--codecs int8,int4,int8:inter]
                                   [--algorithms hierarchical,ring,auto]
                                   [--steps 60] [--ranks-per-host 2] [--optimizer adam|adam-fused]
                                   [--out bench/results/compression]
                                   [--skip-allreduce] [--skip-training] [--netns-prefix P]

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
import signal
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CORPUS_GLOB = "/usr/share/common-licenses/*"
# A communication-bound configuration (bench/RESULTS_compression.md, "Training"): wide layers, a
# short sequence and one row per rank, so a step's gradient (25.7 M float32, 103 MB) takes about
# 4x longer on the 1 Gbit/s link than its forward, backward and Adam step on a core, as a
# GPT-2-class model's does on GPUs joined by Ethernet. (Session 15's first run, d_model 128, 4 layers,
# 8 rows of 64 bytes per rank, was compute-bound: 0.67 s of compute against 30 ms of gradients.)
MODEL = dict(vocab=256, d_model=1024, n_heads=16, n_layers=2, max_seq=32, seed=0)
# The global batch: GLOBAL_ROWS rows of SEQ bytes a step over all ranks, whatever the ranks
# (sessions 16-17: 2 ranks per host x 1 row). --ranks-per-host 1 places one rank per host, so each
# rank has a core of its own as a GPU deployment gives each rank a device, and the intra-host phases
# vanish as NVLink makes them vanish next to Ethernet; each rank then trains on 2 rows, so the
# global batches, the data and the optimisation problem stay the same (RESULTS_compression.md).
GLOBAL_ROWS, SEQ, LR = 4, 32, 1e-3
HOSTS, CORES = 2, 2
# torch.optim.Adam's implementations (--optimizer), the same algorithm and hyper-parameters: "adam" is
# torch's default on CPU tensors, a Python loop over the parameters (0.12 s of a rank's 0.22 s step on a
# core, session 19); "adam-fused" is torch's fused CPU kernel (0.018 s), what a user who times a step
# picks. Both arms of a run use the same one (bench/RESULTS_compression.md, session 19).
OPTIMIZERS = {"adam": {}, "adam-fused": {"fused": True}}


def layout(ranks_per_host: int) -> tuple:
    """(ranks, rows per rank) for ``ranks_per_host`` ranks on each of the HOSTS hosts."""
    ranks = HOSTS * ranks_per_host
    if GLOBAL_ROWS % ranks:
        raise SystemExit(f"compress_netns: --ranks-per-host {ranks_per_host}: {ranks} ranks do not divide "
                         f"the global batch of {GLOBAL_ROWS} rows")
    return ranks, GLOBAL_ROWS // ranks
# CPU ns per float32 element (encode, decode) of the codec loops, one core (docs/compression.md "Cost";
# int8/int4 nearest since session 20's closed-form scale and AVX2 entry: 0.45 to encode)
CODEC_NS = {"int8": (0.45, 0.3), "int4": (0.45, 0.3), "fp8_e4m3": (2.0, 0.65), "fp8_e5m2": (2.0, 0.7), "bf16": (1.5, 0.2)}
# CPU ns per gradient element of error feedback's fused pass (error_feedback_round, one core;
# bench/codec_rates.py --feedback): int8/int4 nearest measured 1.5 in session 17 (the composed
# passes it replaced, 6.7), 0.85 in session 20, which DataParallel now runs in place of its copy of
# the gradient into the bucket (~0.3): 0.55 more than the uncompressed arm. The model charges it
# before each bucket's all_reduce (commlib.sim feedback_ns).
FEEDBACK_NS = 0.55
FEEDBACK_NS_COMPOSED = 6.7  # the composed arms (composed_arm), same measurement


def parse_codec(text: str):
    """``int8`` or ``int8:inter`` (compress_inter_only) -> commlib Codec; a further ``:composed``
    (training arms) only picks the error-feedback step (composed_arm)."""
    from commlib.core.codecs import Codec
    name, *opts = text.split(":")
    return Codec(name, inter_only="inter" in opts)


def composed_arm(text: str) -> bool:
    """``int8:inter:composed``: train with error feedback's step as whole-buffer passes (the form
    before the fused pass: bench/codec_rates.py's composed_feedback), for an A/B in one run."""
    return "composed" in text.split(":")[1:]


def corpus() -> bytes:
    """The licence texts on this disk, concatenated in name order (symlinks skipped: duplicates)."""
    paths = sorted(p for p in glob.glob(CORPUS_GLOB) if os.path.isfile(p) and not os.path.islink(p))
    if not paths:
        raise SystemExit(f"compress_netns: no corpus at {CORPUS_GLOB}")
    return b"\n".join(open(p, "rb").read() for p in paths)


def compute_seconds(rows: int, steps: int = 5, optimizer: str = "adam") -> float:
    """One process's forward + backward + Adam step (``optimizer``: OPTIMIZERS) of MODEL on ``rows``
    x SEQ tokens, one thread, no communication: the median of ``steps`` after a warm-up, in the
    thread's CPU seconds (a quiet core's wall-clock; on a loaded machine the wall-clock is the load's)."""
    import time

    import torch

    from commlib.models import gpt
    torch.set_num_threads(1)
    model = gpt.TinyGPT(gpt.GPTConfig(**MODEL))
    opt = torch.optim.Adam(model.parameters(), lr=LR, **OPTIMIZERS[optimizer])
    x = torch.randint(0, MODEL["vocab"], (rows, SEQ + 1), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(steps + 1):
        t = time.thread_time()  # the thread's CPU: a loaded machine's waits for a core left out
        opt.zero_grad(set_to_none=True)
        model(x[:, :-1], x[:, 1:]).backward()
        opt.step()
        times.append(time.thread_time() - t)
    return float(np.median(times[1:]))


def predict_step(codec, compute_s: float, topology: str, composed: bool = False, ranks_per_host: int = 2) -> dict:
    """The model's step time: compute (one core's, times ranks / CORES when the ranks share the
    cores) plus each DataParallel bucket's all_reduce as commlib.sim predicts it on the link (auto's
    algorithm for the codec: hierarchical, ring with one rank per host; codec rates also scaled by
    the ranks' share of a core), after its
    error-feedback pass (FEEDBACK_NS, scaled alike), not overlapped (the backward is short next
    to the traffic)."""
    import dataclasses

    from commlib import sim
    from commlib.models import gpt
    from commlib.parallel._buckets import MB, dtype_buckets
    params = list(reversed(list(gpt.TinyGPT(gpt.GPTConfig(**MODEL)).parameters())))
    buckets = [sum(p.numel() for p in ps) for _, ps in dtype_buckets(params, int(25 * MB), int(1 * MB))]
    ranks, _ = layout(ranks_per_host)
    share = max(1.0, ranks / CORES)
    topo = dataclasses.replace(sim.load(topology), devices_per_host=ranks_per_host)
    algorithm = "hierarchical" if ranks_per_host > 1 else "ring"
    ns = tuple(share * r for r in CODEC_NS[codec.name]) if codec is not None else (-1.0, -1.0)
    feedback = share * (FEEDBACK_NS_COMPOSED if composed else FEEDBACK_NS) if codec is not None else 0.0
    comm = sum(sim.predict("all_reduce", algorithm, 4 * n, ranks, topo, compress=codec, codec_ns=ns,
                           feedback_ns=feedback)["time_us"]["median"] * 1e-6 for n in buckets)
    return {"compute_s": compute_s * share, "comm_s": comm, "step_s": compute_s * share + comm,
            "gradient_elements": int(sum(buckets)), "buckets": len(buckets)}


def prediction(args) -> dict:
    """The model's step times per training arm, printed and kept with the results."""
    topology = os.path.join(ROOT, "bench", "sim_data", "netns_1gbit.json")
    _, rows = layout(args.ranks_per_host)
    compute = compute_seconds(rows, optimizer=args.optimizer)
    out = {"compute_one_core_s": compute, "load_average": os.getloadavg(), "ranks_per_host": args.ranks_per_host,
           "rows_per_rank": rows, "optimizer": args.optimizer}
    for a in [None] + list(args.training_codecs):
        out[a or "uncompressed"] = p = predict_step(parse_codec(a) if a else None, compute, topology,
                                                    bool(a and composed_arm(a)), args.ranks_per_host)
        print(f"# predicted {a or 'uncompressed'}: step {p['step_s']:.3f} s (compute {p['compute_s']:.3f}, "
              f"all_reduce {p['comm_s']:.3f}; {p['gradient_elements']} elements in {p['buckets']} buckets)", flush=True)
    base = out["uncompressed"]["step_s"]
    for a in args.training_codecs:
        print(f"# predicted speed-up {a}: {base / out[a]['step_s']:.2f}x per step", flush=True)
    return out


def train_rank(comm, data: bytes, codec, steps: int, seed: int = 7, composed: bool = False, rows_per_rank: int = 1,
               optimizer: str = "adam"):
    """One rank's run of ``rows_per_rank`` rows a step: (losses, step end times since start,
    held-out loss); ``composed``: error feedback's step as whole-buffer passes (composed_arm);
    ``optimizer``: Adam's implementation (OPTIMIZERS)."""
    import torch

    import commlib.parallel.data_parallel as dp_module
    if composed:
        from codec_rates import composed_feedback
        dp_module.error_feedback_round = composed_feedback

    from commlib.models import gpt
    from commlib.parallel import DataParallel
    torch.set_num_threads(1)
    arr = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    split = int(len(arr) * 0.9)
    train, held = arr[:split], arr[split:]
    cfg = gpt.GPTConfig(**MODEL)
    dp = DataParallel(gpt.TinyGPT(cfg), comm, compress=codec, error_feedback=codec is not None)
    opt = torch.optim.Adam(dp.parameters(), lr=LR, **OPTIMIZERS[optimizer])
    g = torch.Generator().manual_seed(seed)
    P = comm.size

    def batch(src, rows):
        starts = torch.randint(0, len(src) - SEQ - 1, (rows,), generator=g)
        x = torch.stack([src[s:s + SEQ + 1] for s in starts])
        return x[:, :-1], x[:, 1:]

    comm.barrier()
    # the same draw on every rank: one generator, seeded alike
    losses, times = gpt.train_data_parallel(dp, opt, comm, (batch(train, rows_per_rank * P) for _ in range(steps)),
                                            rows_per_rank)
    with torch.no_grad():
        tokens, targets = batch(held, 64)
        held_loss = float(dp.module(tokens, targets))
    return losses, times, held_loss


def run_training(net, args, out):
    """``--rounds`` rounds, each running every arm once (interleaved, so load drifts hit all arms
    alike); the losses are the same every round (same weights, batches, deterministic codecs), the
    times are reported as the median over rounds."""
    from commlib.testing.netns import NetnsRankPool
    data = corpus()
    arms = [None] + list(args.training_codecs)
    runs = {a or "uncompressed": [] for a in arms}
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    rank_fn = __import__("compress_netns").train_rank
    _, rows = layout(args.ranks_per_host)
    pool = NetnsRankPool(net, [h for h in range(HOSTS) for _ in range(args.ranks_per_host)], timeout=120)
    uptime = [os.getloadavg()]
    try:
        for rnd in range(args.rounds):
            for a in arms:
                per_rank = pool.run(rank_fn, data, parse_codec(a) if a else None, args.steps, 7,
                                    bool(a and composed_arm(a)), rows, args.optimizer, timeout=3600)
                losses, _, held = per_rank[0]
                times = [max(t[1][i] for t in per_rank) for i in range(len(losses))]
                runs[a or "uncompressed"].append({"losses": losses, "times_s": times, "held_out_loss": held})
                print(f"# round {rnd} {a or 'uncompressed'}: loss {np.mean(losses[-10:]):.4f}, "
                      f"{times[-1]:.1f} s, load {os.getloadavg()[0]:.1f}", flush=True)
            uptime.append(os.getloadavg())
            write_training(runs, uptime, data, args, out)  # after every round: a run cut short keeps them
    finally:
        pool.close()


def write_training(runs: dict, uptime: list, data: bytes, args, out: str) -> None:
    """OUT/training.json and OUT/training_loss.png from the rounds so far."""
    results = {name: median_run(rs) for name, rs in runs.items()}
    target = summarize(results)
    info = {"corpus": CORPUS_GLOB, "corpus_bytes": len(data), "model": MODEL, "rows_per_rank": layout(args.ranks_per_host)[1],
            "ranks_per_host": args.ranks_per_host,
            "seq": SEQ, "optimizer": f"Adam ({args.optimizer})", "lr": LR, "steps": args.steps,
            "rounds": len(uptime) - 1,
            "rate": args.rate, "target_loss": target, "load_average_per_round": uptime,
            "prediction": args.prediction, "results": results}
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(info, f, indent=1)
    plot_training(info, os.path.join(out, "training_loss.png"))
    for name, r in results.items():
        print(f"# {name}: final {r['final_loss']:.4f}, held-out {r['held_out_loss']:.4f}, "
              f"median step {r['median_step_s']:.3f} s, to {target:.4f}: {r['seconds_to_target']}", flush=True)


def median_run(rounds: list) -> dict:
    """One arm's rounds -> its losses (round 0's; flags if another round differs), the per-step
    times of the round whose total is the median, and every round's total."""
    totals = [r["times_s"][-1] for r in rounds]
    mid = rounds[int(np.argsort(totals)[len(totals) // 2])]
    same = all(r["losses"] == rounds[0]["losses"] for r in rounds)
    steps = [np.diff([0.0] + r["times_s"]) for r in rounds]
    return {"losses": rounds[0]["losses"], "losses_same_every_round": same, "times_s": mid["times_s"],
            "round_totals_s": totals, "median_step_s": float(np.median(np.concatenate(steps))),
            "held_out_loss": rounds[0]["held_out_loss"]}


def summarize(results: dict, window: int = 10, slack: float = 0.02) -> float:
    """The stated loss: the uncompressed run's final loss (mean of its last ``window`` steps) plus
    ``slack`` (2%, the issue's tolerance). Adds each run's final loss and the wall-clock at which
    its ``window``-step running mean first reaches the stated loss (None: never); returns it."""
    kernel = np.ones(window) / window
    smooth = {n: np.convolve(r["losses"], kernel, mode="valid") for n, r in results.items()}
    target = float(smooth["uncompressed"][-1]) * (1 + slack)
    for name, r in results.items():
        hit = np.nonzero(smooth[name] <= target)[0]
        r["final_loss"] = float(smooth[name][-1])
        r["seconds_to_target"] = float(r["times_s"][hit[0] + window - 1]) if hit.size else None
        r["steps_to_target"] = int(hit[0] + window) if hit.size else None
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
    b.set_xlabel("wall-clock (s, the median round)")
    for ax in (a, b):
        ax.set_ylabel("training loss (nats/byte)")
        ax.axhline(info["target_loss"], color="grey", ls=":", lw=1)
        ax.legend(fontsize=8)
    m = info["model"]
    fig.suptitle(f"GPT d_model {m['d_model']} x {m['n_layers']} layers on {info['corpus_bytes']} bytes of licence "
                 f"texts, 2 hosts x {info['ranks_per_host']} ranks at {info['rate']}")
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
    p.add_argument("--rounds", type=int, default=3, help="training: rounds of every arm, interleaved")
    p.add_argument("--training-codecs", default="int8:inter,int4:inter")
    p.add_argument("--ranks-per-host", type=int, default=2, choices=(1, 2, 4),
                   help="training: ranks on each of the 2 hosts; the global batch stays 4 rows (1: a core per rank)")
    p.add_argument("--optimizer", default="adam", choices=sorted(OPTIMIZERS),
                   help="training: Adam's implementation, the same for every arm (adam: torch's per-parameter loop)")
    p.add_argument("--predict-only", action="store_true", help="print the model's step times and exit")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "compression"))
    p.add_argument("--skip-allreduce", action="store_true")
    p.add_argument("--skip-training", action="store_true")
    p.add_argument("--netns-prefix", default=None, help="training: the namespaces' name prefix (default: scripts/netns.sh's)")
    args = p.parse_args(argv)
    # SIGTERM (a run cut short) unwinds like Ctrl-C, so the namespaces and ranks are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.sizes = [s for s in args.sizes.split(",") if s]
    args.codecs = [c for c in args.codecs.split(",") if c]
    args.training_codecs = [c for c in args.training_codecs.split(",") if c]
    os.makedirs(args.out, exist_ok=True)
    print(f"# load average at start: {os.getloadavg()}", flush=True)
    if not args.skip_training or args.predict_only:
        args.prediction = prediction(args)
        if args.predict_only:
            return 0
    if not args.skip_allreduce:
        run_allreduce(args, args.out)
    if not args.skip_training:
        from commlib.testing.netns import Namespaces
        with Namespaces(2, rate=args.rate, prefix=args.netns_prefix) as net:
            run_training(net, args, args.out)
    print(f"# load average at end: {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
