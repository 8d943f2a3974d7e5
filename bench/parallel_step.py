"""Step time and memory per rank of the tiny GPT under each tensor/sequence-parallel mode.

    .venv/bin/python bench/parallel_step.py [--ranks 4] [--seq 256] [--out bench/RESULTS_tensor_sequence.md]

Runs every mode on one pool of ``--ranks`` processes (commlib.testing) plus the single-process
baseline in this process, one torch thread per rank. Reports per mode the slowest rank's median
step time (forward + backward + gradient all-reduce over cp + SGD), and per rank the parameter
bytes and the activation bytes saved for backward (the memory the parallelisms divide). CPU step
times on a shared machine are indicative only; the memory columns are exact.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # this checkout's commlib, not an installed one

from commlib.models.gpt_timing import measure_step  # noqa: E402


def modes(P):
    m = [("tp%d" % P, dict(tp_size=P)),
         ("tp%d+sp" % P, dict(tp_size=P, sequence_parallel=True)),
         ("cp%d ring contiguous" % P, dict(cp_size=P)),
         ("cp%d ring zigzag" % P, dict(cp_size=P, layout="zigzag")),
         ("cp%d ulysses" % P, dict(cp_size=P, cp_mode="ulysses"))]
    if P % 2 == 0 and P > 2:
        m += [("cp%d hybrid (ulysses 2 x ring %d, zigzag)" % (P, P // 2),
               dict(cp_size=P, cp_mode="hybrid", ulysses_size=2, layout="zigzag")),
              ("tp2 x cp%d ring zigzag" % (P // 2), dict(tp_size=2, cp_size=P // 2, layout="zigzag")),
              ("tp2+sp x cp%d ring zigzag" % (P // 2),
               dict(tp_size=2, cp_size=P // 2, layout="zigzag", sequence_parallel=True))]
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=None, help="write a Markdown report here")
    a = ap.parse_args()
    cfg = dict(vocab=a.vocab, d_model=a.d_model, n_heads=a.heads, n_layers=2, max_seq=a.seq)
    kw = dict(cfg=cfg, batch=a.batch, seq=a.seq, steps=a.steps)
    rows = []
    load0 = os.getloadavg()[0]
    base = measure_step(None, **kw)
    rows.append(("single process", [base]))
    print(f"{'single process':42s} {base['step_ms']:9.1f} ms")
    from commlib.testing import close_pools, get_pool
    try:
        pool = get_pool(a.ranks, timeout=600)
        for name, m in modes(a.ranks):
            res = pool.run(measure_step, **m, **kw)
            rows.append((name, res))
            print(f"{name:42s} {max(r['step_ms'] for r in res):9.1f} ms  "
                  f"act/rank {max(r['saved_bytes'] for r in res) / 2**20:6.1f} MiB  loss {res[0]['loss']:.5f}")
    finally:
        close_pools()
    if a.out:
        write(a, rows, base, (load0, os.getloadavg()[0]))


def write(a, rows, base, load):
    mib = 2 ** 20
    lines = [
        "## Tensor and sequence parallelism: tiny GPT training step",
        "",
        f"`bench/parallel_step.py --ranks {a.ranks} --seq {a.seq}`; {time.strftime('%Y-%m-%d')}, "
        f"{platform.machine()}, {os.cpu_count()} cores (shared), one torch thread per rank. Model: 2 layers, "
        f"d_model {a.d_model}, {a.heads} heads, vocab {a.vocab}; batch {a.batch} x {a.seq} tokens; fp32, SGD. "
        f"Step = forward + backward + cp gradient all-reduce + SGD; time is the slowest rank's median of "
        f"{a.steps}. Memory per rank is exact (parameters; tensors saved for backward). The loss column "
        "checks every mode computes the same step.",
        "",
        "| mode | step (ms) | vs single | params / rank (MiB) | saved activations / rank (MiB) | loss |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, res in rows:
        t = max(r["step_ms"] for r in res)
        lines.append(f"| {name} | {t:.1f} | {base['step_ms'] / t:.2f}x | "
                     f"{max(r['param_bytes'] for r in res) / mib:.2f} | "
                     f"{max(r['saved_bytes'] for r in res) / mib:.1f} | {res[0]['loss']:.5f} |")
    lines += ["", f"Load average during the run: {load[0]:.1f} at the start, {load[1]:.1f} at the end (other jobs "
              f"shared the machine). {a.ranks} ranks share {os.cpu_count()} cores here, so step-time ratios measure overheads "
              "(communication, oversubscription), not the speed-up on dedicated devices; the memory columns "
              "show what each mode divides: tp the parameters and the activations inside the tp regions, "
              "tp+sp also the activations between them, cp every activation but not the parameters.", ""]
    with open(a.out, "w") as f:
        f.write("\n".join(lines))
    print("wrote", a.out)


if __name__ == "__main__":
    main()
