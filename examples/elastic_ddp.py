"""DDP that survives a dead rank: one rank is SIGKILLed mid-training, the others shrink the group
and train on (docs/fault_tolerance.md).

    python examples/elastic_ddp.py [--nproc 4] [--kill-rank 2] [--kill-step 5] [--steps 20]

This script starts the ranks itself (not torchrun, whose agent restarts every worker when one
dies), and serves the rendezvous store from the parent process, so the store outlives any rank.
Each survivor catches the error from ``loss.backward()``, drops its DDP wrapper, calls
``dist.shrink_group`` with the ranks the communicator sees dead, wraps the model again on the new
default group and redoes the step; the data is re-sharded over the survivors from then on.
"""
import argparse
import datetime
import gc
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def batch(step, shard, shards, n=32):
    """This shard's part of the global batch at ``step`` (the same global batch whoever is left)."""
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(n * 4, 16, generator=gen)
    y = torch.sin(x.sum(1, keepdim=True))
    return x[shard::shards], y[shard::shards]


def rank_main(rank, world, port, args):
    torch.set_num_threads(1)
    import commlib.torch as ct
    store = dist.TCPStore("127.0.0.1", port, world, False, datetime.timedelta(seconds=30))
    dist.init_process_group("commlib", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=10))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    while step < args.steps:
        x, y = batch(step, dist.get_rank(), dist.get_world_size())
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        if rank == args.kill_rank and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            loss.backward()
        except RuntimeError as exc:
            dead = ct.dead_ranks()
            print(f"rank {rank}: step {step} failed ({str(exc).splitlines()[0][:120]}...); "
                  f"shrinking without ranks {dead}", flush=True)
            del ddp, loss
            gc.collect()  # the old reducer's autograd hooks go with it
            dist.shrink_group(dead, shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
            ddp = DDP(model)  # on the new default group; redo the step on its shards
            continue
        opt.step()
        if step % 5 == 0 or step == args.steps - 1:
            avg = loss.detach().clone()
            dist.all_reduce(avg, op=dist.ReduceOp.AVG)
            if dist.get_rank() == 0:
                print(f"step {step:3d}  loss {avg.item():.5f}  (world {dist.get_world_size()})", flush=True)
        step += 1
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    assert torch.equal(flat, ref), "parameters differ across the survivors"
    if dist.get_rank() == 0:
        print(f"done: {dist.get_world_size()} survivors hold identical parameters", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--kill-rank", type=int, default=2)
    ap.add_argument("--kill-step", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    if not 0 < args.kill_rank < args.nproc:
        ap.error("--kill-rank: pick a rank other than 0 (rank 0 prints) below --nproc")
    server = dist.TCPStore("127.0.0.1", 0, args.nproc, True, datetime.timedelta(seconds=30),
                           wait_for_workers=False)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, args.nproc, server.port, args)) for r in range(args.nproc)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    codes = [p.exitcode for p in procs]
    print(f"exit codes: {codes} (rank {args.kill_rank}: -{int(signal.SIGKILL)}, killed on purpose)")
    ok = all(c == 0 for r, c in enumerate(codes) if r != args.kill_rank)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
