"""Train a small MLP with unmodified DistributedDataParallel over the "commlib" backend.

    torchrun --nproc-per-node 2 examples/train_ddp.py [--steps 50] [--algorithm ring]

Each rank draws its own shard of a synthetic regression batch; DDP averages the gradients with
commlib's all_reduce. Rank 0 prints the loss averaged over all ranks.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import commlib.torch  # noqa: E402,F401  (registers the backend "commlib")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    ap.add_argument("--algorithm", default=None,
                    help="all_reduce algorithm (ring, recursive_doubling, rabenseifner, ...)")
    args = ap.parse_args()

    opts = commlib.torch.Options(algorithms={"all_reduce": args.algorithm}) if args.algorithm else None
    dist.init_process_group("commlib", pg_options=opts)  # env:// from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    w_true = torch.randn(16, 1)

    gen = torch.Generator().manual_seed(1234 + rank)
    for step in range(args.steps):
        x = torch.randn(args.batch, 16, generator=gen)
        y = torch.sin(x @ w_true) + 0.01 * torch.randn(args.batch, 1, generator=gen)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 or step == args.steps - 1:
            avg = loss.detach().clone()
            dist.all_reduce(avg, op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step:4d}  loss {avg.item():.5f}  (world {world})", flush=True)

    # every rank holds the same parameters
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    assert torch.equal(flat, ref), "parameters differ across ranks"
    if rank == 0:
        print("done: parameters identical on all ranks", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
