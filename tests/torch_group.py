"""The default "commlib" process group over a pool's ranks, for the rank side of torch tests.

Rank 0 picks a free loopback port for torch's tcp:// rendezvous and shares it through the pool's own
communicator, so every test module that needs a torch group starts it the same way.
"""
from __future__ import annotations

import datetime
import socket

import torch
import torch.distributed as dist


def init_commlib_group(comm, timeout_s: float = 20) -> None:
    """``dist.init_process_group("commlib")`` over the pool's ranks (tcp:// on a port rank 0 picks)."""
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
