"""Train the tiny GPT with tensor x context x pipeline x data parallelism on commlib.

    torchrun --nproc-per-node 8 examples/train_4d.py --tp 2 --pp 2 --dp 2
    torchrun --nproc-per-node 8 examples/train_4d.py --tp 2 --cp 2 --pp 2 --schedule zero_bubble
    torchrun --nproc-per-node 4 examples/train_4d.py --pp 2 --dp 2 --schedule interleaved --check

The world is split by a Mesh in the order [TP, CP, PP, DP] (TP ranks adjacent). Every rank builds
the same TinyGPT (tensor-parallel over mesh.tp, sequence-sharded over mesh.cp) and keeps its
pipeline stage(s); the schedule moves activations between mesh.pp ranks; gradients are summed over
cp (replicated parameters) and the optimizer is ZeRO-1 over mesh.dp. ``--check`` also trains the
whole model in one process (on every rank, same data, same AdamW) and asserts the losses agree.
``--device cuda`` puts every rank's part on GPU ``LOCAL_RANK % device count`` (several ranks may
share one); that path has never run on a GPU (docs/pipeline.md).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import commlib  # noqa: E402
from commlib.models.gpt import GPTConfig, GPTStage, TinyGPT  # noqa: E402
from commlib.parallel import (Mesh, PipelineStage, Schedule1F1B, ScheduleGPipe,  # noqa: E402
                              ScheduleInterleaved1F1B, ScheduleZeroBubble, ZeroOptimizer)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B,
             "zero_bubble": ScheduleZeroBubble}


def batch(cfg, step, size, seq):
    g = torch.Generator().manual_seed(1234 + step % 4)  # 4 batches cycled: the loss visibly falls
    d = torch.randint(0, cfg.vocab, (size, seq + 1), generator=g)
    return d[:, :-1], d[:, 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for dim in ("tp", "cp", "pp", "dp"):
        ap.add_argument(f"--{dim}", type=int, default=1)
    ap.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    ap.add_argument("--stages-per-rank", type=int, default=None, help="default: 2 for interleaved, else 1")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--check", action="store_true", help="compare with single-process training")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where every rank's part lives")
    a = ap.parse_args()
    torch.set_num_threads(1)

    comm = commlib.init()
    device = torch.device("cpu")
    if a.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", comm.rank)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    mesh = Mesh(comm, tp=a.tp, cp=a.cp, pp=a.pp, dp=a.dp)
    v = a.stages_per_rank or (2 if a.schedule == "interleaved" else 1)
    S = a.pp * v
    cfg = GPTConfig(n_layers=a.layers, max_seq=a.seq)
    model = TinyGPT(cfg, {"tp": mesh.tp, "cp": mesh.cp}).to(device)
    mine = range(mesh.pp.rank, S, a.pp)  # stage s on pipeline rank s % pp (a loop when v > 1)
    parts = [GPTStage(model, s, S) for s in mine]
    stages = [PipelineStage(part, s, S, mesh.pp) for part, s in zip(parts, mine)]
    sched = SCHEDULES[a.schedule](stages if v > 1 else stages[0], n_microbatches=a.microbatches,
                                  loss_fn=parts[-1].loss)
    params = [p for part in parts for p in part.parameters()]
    opt = ZeroOptimizer(torch.optim.AdamW, params, mesh.dp, stage=1, lr=a.lr)
    first, last = parts[0].first, parts[-1].last
    reporter = last and mesh.tp.rank == 0 and mesh.cp.rank == 0 and mesh.dp.rank == 0

    if a.check:
        ref = TinyGPT(cfg).to(device)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=a.lr)
    worst = 0.0
    for step in range(a.steps):
        tokens, targets = (t.to(device) for t in batch(cfg, step, a.batch, a.seq))
        k = a.batch // mesh.dp.size  # this data-parallel replica's rows, then its sequence part
        rows = slice(mesh.dp.rank * k, (mesh.dp.rank + 1) * k)
        tok, tgt = model.shard(tokens[rows]), model.shard(targets[rows])
        opt.zero_grad()
        losses = []
        sched.step(*([tok] if first else []), **({"target": tgt, "losses": losses} if last else {}))
        model.sync_grads()  # parameters are replicated over cp: sum their gradients
        opt.step()
        if last:
            loss = torch.tensor([sum(x.item() for x in losses) / a.microbatches], device=device)
            mesh.cp.all_reduce(loss)           # the shares of the sequence parts add up
            mesh.dp.all_reduce(loss, op="avg")  # the replicas' batches average
        if a.check:
            ref_opt.zero_grad()
            ref_loss = ref(tokens, targets)
            ref_loss.backward()
            ref_opt.step()
            if last:
                worst = max(worst, abs(loss.item() - ref_loss.item()))
        if reporter and (step % 5 == 0 or step == a.steps - 1):
            extra = f"  single process {ref_loss.item():.6f}" if a.check else ""
            print(f"step {step:3d}  loss {loss.item():.6f}{extra}", flush=True)
    sched.close()
    if a.check and last:
        assert worst < 1e-4, f"pipeline loss differs from single process by {worst:.2e}"
    if reporter:
        print(f"done: tp={a.tp} cp={a.cp} pp={a.pp} dp={a.dp} {a.schedule} on {comm.size} ranks"
              + (f"; max |loss - single process| = {worst:.2e}" if a.check else ""), flush=True)
    mesh.close()
    comm.close()


if __name__ == "__main__":
    main()
