"""Rendezvous: find the ranks, share the shared-memory region, build communicators.

Rank 0 creates the region as a memfd (anonymous: nothing appears in /dev/shm, and a crash leaves
nothing behind) and publishes ``pid:fd`` through the store; the other ranks open it through
/proc/<pid>/fd, map it, and say so; rank 0 drops its descriptor once every rank has mapped it.
"""
from __future__ import annotations

import os
import socket
import sys
from typing import Optional

from commlib import _C, settings
from commlib.communicator import Communicator
from commlib.store import StoreServer, TCPStore

_DEBUG_LEVELS = {"": 0, "0": 0, "OFF": 0, "WARN": 0, "INFO": 1, "TRACE": 2}


def _env_int(*names) -> Optional[int]:
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise ValueError(f"{n}: expected an integer, got {v!r}") from None
    return None


def debug_level() -> int:
    """0, 1 (INFO) or 2 (TRACE) from COMMLIB_DEBUG."""
    v = settings.get("COMMLIB_DEBUG").upper()
    if v not in _DEBUG_LEVELS:
        raise ValueError(f"COMMLIB_DEBUG: expected INFO or TRACE, got {v!r}")
    return _DEBUG_LEVELS[v]


def default_timeout() -> float:
    """Seconds from COMMLIB_TIMEOUT (default 300)."""
    return settings.get_seconds("COMMLIB_TIMEOUT")


def _log(level: int, msg: str):
    if debug_level() >= level:
        print(f"commlib {'INFO' if level == 1 else 'TRACE'} {msg}", file=sys.stderr, flush=True)


def init(rank: Optional[int] = None, world_size: Optional[int] = None, store=None,
         master_addr: Optional[str] = None, master_port: Optional[int] = None,
         timeout: Optional[float] = None, prefix: str = "commlib") -> Communicator:
    """Create the world communicator.

    Rank and size come from the arguments, else from the launcher's environment: RANK/WORLD_SIZE
    (torchrun), OMPI_COMM_WORLD_RANK/SIZE (mpirun), PMI_RANK/SIZE, SLURM_PROCID/NTASKS (srun).
    Rendezvous uses ``store`` (any torch.distributed Store, or commlib.store.TCPStore) or, if none,
    a store at MASTER_ADDR:MASTER_PORT (default 127.0.0.1:29500): torchrun's agent store when
    running under torchrun, else one that rank 0 serves. ``timeout`` (seconds, default
    COMMLIB_TIMEOUT or 300) bounds every wait on a peer. ``prefix`` namespaces the store keys so
    several communicators can share one store.
    """
    if rank is None:
        rank = _env_int("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
    if world_size is None:
        world_size = _env_int("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
    if rank is None or world_size is None:
        raise ValueError("rank/world_size: not given and not found in the environment "
                         "(RANK/WORLD_SIZE, OMPI_COMM_WORLD_RANK/SIZE, SLURM_PROCID/NTASKS)")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: must be a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank: {rank!r} is out of range for world_size {world_size}")
    timeout = default_timeout() if timeout is None else float(timeout)
    if timeout <= 0:
        raise ValueError("timeout: must be positive")
    owned = store is None
    server = None
    if owned:
        store, server = _default_store(rank, world_size, master_addr, master_port, timeout)
    comm = create(store, prefix, rank, world_size, timeout)
    if owned:  # close() releases what init() opened: the store connection and rank 0's server
        comm._owned = (store, server)
    return comm


def _default_store(rank, world_size, master_addr, master_port, timeout):
    addr = master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = master_port if master_port is not None else _env_int("MASTER_PORT")
    port = 29500 if port is None else port
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        # torchrun's agent already serves a store on MASTER_PORT: join it as a client.
        from datetime import timedelta

        import torch.distributed as dist
        return dist.TCPStore(addr, port, world_size, False, timedelta(seconds=timeout)), None
    server = None
    if rank == 0:
        try:
            server = StoreServer("0.0.0.0" if addr not in ("127.0.0.1", "localhost") else addr, port)
        except OSError as e:
            raise RuntimeError(f"master_port: rank 0 cannot serve the rendezvous store on {addr}:{port} "
                               f"({e.strerror}); pick a free MASTER_PORT") from None
    # Port 0 lets rank 0 pick a free port (useful for a world of one).
    return TCPStore(addr, server.port if server else port, timeout=timeout), server


def _get(store, key: str) -> bytes:
    v = store.get(key)
    return v if isinstance(v, bytes) else bytes(v)


def create(store, prefix: str, rank: int, size: int, timeout: float) -> Communicator:
    """Build a communicator of ``size`` ranks over ``store`` keys under ``prefix`` (collective)."""
    host = socket.gethostname()
    fd = -1
    my_fd = -1
    try:
        if rank == 0:
            fd = os.memfd_create(f"commlib:{prefix}", os.MFD_CLOEXEC)
            os.ftruncate(fd, _C.shm_region_bytes(size))
            my_fd = fd
            # Rank 0 lays out the region before anyone may open it.
            core = _C.Communicator(rank, size, my_fd, timeout, prefix, debug_level())
            store.set(f"{prefix}/shm", f"{os.getpid()}:{fd}:{host}")
        else:
            pid, rfd, rhost = _get(store, f"{prefix}/shm").decode().split(":", 2)
            if rhost != host:
                raise RuntimeError(f"rank {rank} runs on {host} but rank 0 on {rhost}: this build's "
                                   "transport is shared memory, so all ranks must share one host")
            my_fd = os.open(f"/proc/{pid}/fd/{rfd}", os.O_RDWR | os.O_CLOEXEC)
            core = _C.Communicator(rank, size, my_fd, timeout, prefix, debug_level())
            os.close(my_fd)
            my_fd = -1
        # Rank 0 keeps the memfd open until everyone has mapped it, then it disappears with the
        # last mapping.
        store.set(f"{prefix}/mapped/{rank}", b"1")
        if rank == 0:
            for r in range(1, size):
                _get(store, f"{prefix}/mapped/{r}")
            os.close(fd)
            fd = my_fd = -1
            store.set(f"{prefix}/ready", b"1")
        else:
            _get(store, f"{prefix}/ready")
        # Every rank is mapped and has published its pid: probe single-copy reads (peers keep
        # sending through the channels until they see this rank's answer).
        direct = core.enable_direct_reads()
    finally:
        if my_fd >= 0:
            os.close(my_fd)
    if rank == 0:
        _log(1, f"{prefix}: {size} ranks on {host}, transport shm, "
                f"{_C.shm_region_bytes(size) >> 20} MiB region, single-copy reads "
                f"{'on' if direct else 'off'}, timeout {timeout:g} s")
    return Communicator(core, store, prefix, rank, size, timeout, split=split_communicator)


def split_communicator(comm: Communicator, color, key: int, n: int, timeout: float):
    """Implementation of Communicator.split (collective over ``comm``)."""
    prefix = f"{comm._prefix}/split{n}"
    store = comm._store
    store.set(f"{prefix}/in/{comm.rank}", f"{'-' if color is None else color}:{key}")
    entries = []
    for r in range(comm.size):
        c, k = _get(store, f"{prefix}/in/{r}").decode().split(":")
        entries.append((None if c == "-" else int(c), int(k), r))
    if color is None:
        return None
    members = sorted((k, r) for c, k, r in entries if c == color)
    new_rank = [r for _, r in members].index(comm.rank)
    return create(store, f"{prefix}/c{color}", new_rank, len(members), timeout)
