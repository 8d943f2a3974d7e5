"""Train a small transformer-ish MLP stack with FSDP2 (fully_shard) over the "commlib" backend.

    torchrun --nproc-per-node 2 examples/train_fsdp2.py [--steps 30]
    torchrun --nproc-per-node 4 examples/train_fsdp2.py --hsdp 2   # 2-D mesh: replicate x shard

Parameters are sharded over the mesh; FSDP2 all-gathers them for forward/backward and
reduce-scatters the gradients (ReduceOp.AVG) with commlib's collectives. Rank 0 prints the loss.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

import commlib.torch  # noqa: E402,F401  (registers the backend "commlib")


class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--hsdp", type=int, default=0, help="replicas for HSDP (2-D mesh); 0: FSDP")
    args = ap.parse_args()

    dist.init_process_group("commlib")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.hsdp:
        mesh = init_device_mesh("cpu", (args.hsdp, world // args.hsdp),
                                mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))

    torch.manual_seed(0)
    d = args.dim
    model = torch.nn.Sequential(*[Block(d) for _ in range(args.layers)], torch.nn.Linear(d, 1))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    target = torch.randn(d, 1, generator=torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(args.steps):
        x = torch.randn(16, d, generator=gen)
        y = torch.tanh(x @ target)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 5 == 0 or step == args.steps - 1:
            avg = loss.detach().clone()
            dist.all_reduce(avg, op=dist.ReduceOp.AVG)
            if rank == 0:
                print(f"step {step:4d}  loss {avg.item():.5f}  (mesh {tuple(mesh.shape)})",
                      flush=True)
    n = sum(p.numel() for p in model.parameters())
    local = sum(p.to_local().numel() for p in model.parameters())
    if rank == 0:
        print(f"done: {n} parameters, {local} held by rank 0", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
