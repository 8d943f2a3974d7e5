"""Rank-side cases of the torch fault tests: a rank is SIGKILLed in the middle of training.

Workers import this module by name (the test puts this directory on sys.path). Each case runs in a
fresh pool (``commlib.testing.run_killing_one_rank``): the victim's death retires the pool.
"""
from __future__ import annotations

import datetime
import os
import signal
import socket
import time

import torch
import torch.distributed as dist


def init_torch(comm, timeout_s: float = 20):
    """The default "commlib" process group over the pool's ranks (tcp:// rendezvous on a port
    rank 0 picks and shares through the pool's communicator)."""
    import commlib.torch  # noqa: F401  (registers the backend)
    port = torch.zeros(1, dtype=torch.int64)
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    comm.broadcast(port, root=0)
    dist.init_process_group("commlib", init_method=f"tcp://127.0.0.1:{int(port.item())}",
                            rank=comm.rank, world_size=comm.size,
                            timeout=datetime.timedelta(seconds=timeout_s))


def die():
    """SIGKILL this process: no cleanup, no goodbye to the peers (as an OOM kill or a lost node)."""
    os.kill(os.getpid(), signal.SIGKILL)


def two_layer_model(seed: int = 0, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4)).to(dtype)


def batch(step: int, rank: int, n: int = 4, dtype=torch.float32):
    """This rank's batch at ``step`` (deterministic, so a one-process replay can rebuild it)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 8, generator=g, dtype=dtype), torch.randn(n, 4, generator=g, dtype=dtype)


def case_ddp_backward_raises(comm, victim, kill_step=3, steps=8):
    """DDP over "commlib"; ``victim`` dies at ``kill_step`` before its backward. Every survivor's
    ``loss.backward()`` must raise a Python exception (not crash): returns (message, seconds)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    init_torch(comm)
    ddp = DDP(two_layer_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(steps):
        x, y = batch(step, comm.rank)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        if step == kill_step and comm.rank == victim:
            die()
        t0 = time.monotonic()
        try:
            loss.backward()
        except Exception as exc:  # noqa: BLE001 - the point of the case
            return f"{type(exc).__name__}: {exc}", time.monotonic() - t0
        opt.step()
    return None
