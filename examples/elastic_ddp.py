"""DDP that survives a dead rank and grows back: one rank is SIGKILLed mid-training, the others
shrink the group and train on, a replacement joins and the job finishes at full size
(docs/fault_tolerance.md).

    python examples/elastic_ddp.py [--nproc 4] [--kill-rank 2] [--kill-step 5] [--grow-step 10]
                                   [--steps 20]

This script starts the ranks itself (not torchrun, whose agent restarts every worker when one
dies), and serves the rendezvous store from the parent process, so the store outlives any rank.
Each survivor catches the error from ``loss.backward()``, drops its DDP wrapper, calls
``dist.shrink_group`` with the ranks the communicator sees dead, wraps the model again on the new
default group and redoes the step; the data is re-sharded over the survivors from then on. When
the launcher sees the rank die it starts a replacement, which joins through the same store
(``commlib.join`` + ``commlib.torch.join_group``); at ``--grow-step`` the survivors call
``commlib.torch.grow_group``, and everyone wraps the model in DDP again on the grown group (which
sends rank 0's parameters) and takes rank 0's step and optimizer state (momentum). ``--grow-step
-1`` leaves the job small.
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


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def welcome(model, opt, step):
    """Every rank of the grown group, the replacement included: DDP on the grown group (its
    construction sends rank 0's parameters and buffers), then rank 0's step and optimizer state."""
    import commlib.torch as ct
    from commlib.parallel import broadcast_optimizer_state
    ddp = DDP(model)
    at = torch.tensor([step])
    dist.broadcast(at, src=0)
    broadcast_optimizer_state(ct.get_communicator(), opt)
    return ddp, int(at.item())


def train(model, opt, ddp, step, args, kill):
    """Steps ``step``..: shrink on a dead rank, grow back at --grow-step; ``kill``: die at --kill-step."""
    import commlib.torch as ct
    while step < args.steps:
        if step == args.grow_step and dist.get_world_size() < args.nproc:
            missing = args.nproc - dist.get_world_size()
            if dist.get_rank() == 0:
                print(f"step {step}: growing back by {missing} (waiting for the replacement)", flush=True)
            del ddp
            gc.collect()
            ct.grow_group(missing, timeout=120)
            ddp, step = welcome(model, opt, step)
        x, y = batch(step, dist.get_rank(), dist.get_world_size())
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        if kill and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            loss.backward()
        except RuntimeError as exc:
            dead = ct.dead_ranks()
            print(f"rank {dist.get_rank()}: step {step} failed ({str(exc).splitlines()[0][:120]}...); "
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
    assert torch.equal(flat, ref), "parameters differ across the ranks"
    if dist.get_rank() == 0:
        print(f"done: {dist.get_world_size()} ranks hold identical parameters", flush=True)
    dist.destroy_process_group()


def rank_main(rank, world, port, args):
    torch.set_num_threads(1)
    import commlib.torch  # noqa: F401  (registers the backend)
    store = dist.TCPStore("127.0.0.1", port, world, False, datetime.timedelta(seconds=30))
    dist.init_process_group("commlib", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=10))
    model, opt = build()
    train(model, opt, DDP(model), 0, args, kill=rank == args.kill_rank)


def replacement_main(port, args):
    """A new process: joins the job through its store, then trains with the others to the end."""
    torch.set_num_threads(1)
    import commlib
    import commlib.torch as ct
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    # the members gave init_process_group a store=, so torch added no "default_pg" prefix to it
    comm = commlib.join(**ct.join_arguments(store, from_init_method=False), timeout=120)
    ct.join_group(comm, store, timeout=datetime.timedelta(seconds=10), from_init_method=False)
    print(f"replacement: joined as rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
    model, opt = build()
    ddp, step = welcome(model, opt, 0)
    train(model, opt, ddp, step, args, kill=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--kill-rank", type=int, default=2)
    ap.add_argument("--kill-step", type=int, default=5)
    ap.add_argument("--grow-step", type=int, default=10, help="step at which a replacement joins (-1: never)")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    if not 0 < args.kill_rank < args.nproc:
        ap.error("--kill-rank: pick a rank other than 0 (rank 0 prints) below --nproc")
    if args.grow_step != -1 and not args.kill_step < args.grow_step < args.steps:
        ap.error("--grow-step: after --kill-step and before --steps (or -1)")
    server = dist.TCPStore("127.0.0.1", 0, args.nproc, True, datetime.timedelta(seconds=30),
                           wait_for_workers=False)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, args.nproc, server.port, args)) for r in range(args.nproc)]
    for p in procs:
        p.start()
    victim = procs[args.kill_rank]
    victim.join(120)  # the launcher sees the rank die and starts a replacement
    if args.grow_step != -1:
        procs.append(ctx.Process(target=replacement_main, args=(server.port, args)))
        procs[-1].start()
    for p in procs:
        p.join(180)
    codes = [p.exitcode for p in procs]
    print(f"exit codes: {codes} (rank {args.kill_rank}: -{int(signal.SIGKILL)}, killed on purpose"
          + ("; the last one is the replacement)" if args.grow_step != -1 else ")"))
    ok = all(c == 0 for r, c in enumerate(codes) if r != args.kill_rank)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
