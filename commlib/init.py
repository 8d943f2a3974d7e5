"""Rendezvous: find the ranks, share the shared-memory region, build communicators.

Each host's lowest rank creates its host's region as a memfd (anonymous: nothing appears in
/dev/shm, and a crash leaves nothing behind) and publishes ``pid:fd`` through the store; the other
ranks of the host open it through /proc/<pid>/fd, map it, and say so; the leader drops its
descriptor once they all have. Hosts and TCP addresses come from commlib.bootstrap.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from commlib import _C, bootstrap
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
    v = os.environ.get("COMMLIB_DEBUG", "").upper()
    if v not in _DEBUG_LEVELS:
        raise ValueError(f"COMMLIB_DEBUG: expected INFO or TRACE, got {v!r}")
    return _DEBUG_LEVELS[v]


def default_timeout() -> float:
    v = os.environ.get("COMMLIB_TIMEOUT")
    if v in (None, ""):
        return 300.0
    try:
        t = float(v)
    except ValueError:
        raise ValueError(f"COMMLIB_TIMEOUT: expected seconds, got {v!r}") from None
    if t <= 0:
        raise ValueError("COMMLIB_TIMEOUT: must be positive")
    return t


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
    """Build a communicator of ``size`` ranks over ``store`` keys under ``prefix`` (collective).

    Ranks on one host (commlib.bootstrap.host_id) share one memory region, created by the host's
    lowest rank; ranks on other hosts are reached over TCP (commlib.bootstrap).
    """
    topo = bootstrap.discover_hosts(store, prefix, rank, size)
    hidx = topo.host_of[rank]
    local = topo.ranks_on(hidx)
    local_size, leader = len(local), local[0]
    shm_key = f"{prefix}/shm/{hidx}"
    endpoint = bootstrap.listen(store, prefix, rank, topo, timeout, debug_level()) if len(topo.hosts) > 1 else None
    fd = -1
    my_fd = -1
    try:
        if rank == leader:
            fd = os.memfd_create(f"commlib:{prefix}", os.MFD_CLOEXEC)
            os.ftruncate(fd, _C.shm_region_bytes(local_size))
            my_fd = fd
            # The leader lays out the region before anyone may open it.
            core = _C.Communicator(rank, size, my_fd, topo.host_of, topo.hosts, endpoint, timeout, prefix,
                                   debug_level())
            store.set(shm_key, f"{os.getpid()}:{fd}")
        else:
            pid, rfd = _get(store, shm_key).decode().split(":", 1)
            my_fd = os.open(f"/proc/{int(pid)}/fd/{int(rfd)}", os.O_RDWR | os.O_CLOEXEC)
            core = _C.Communicator(rank, size, my_fd, topo.host_of, topo.hosts, endpoint, timeout, prefix,
                                   debug_level())
            os.close(my_fd)
            my_fd = -1
        # The leader keeps the memfd open until every rank of its host has mapped it, then it
        # disappears with the last mapping.
        store.set(f"{prefix}/mapped/{rank}", b"1")
        if rank == leader:
            for r in local[1:]:
                _get(store, f"{prefix}/mapped/{r}")
            os.close(fd)
            fd = my_fd = -1
            store.set(f"{shm_key}/ready", b"1")
        else:
            _get(store, f"{shm_key}/ready")
        if endpoint is not None:
            core.connect(bootstrap.addresses(store, prefix, rank, topo))
        # Every rank is mapped and has published its pid: probe single-copy reads (peers keep
        # sending through the channels until they see this rank's answer).
        direct = core.enable_direct_reads()
    finally:
        if my_fd >= 0:
            os.close(my_fd)
    if rank == 0:
        links = "shm" if len(topo.hosts) == 1 else "shm within hosts, tcp across"
        _log(1, f"{prefix}: {size} ranks on {topo}, links {links}, "
                f"{_C.shm_region_bytes(local_size) >> 20} MiB region per host, single-copy reads "
                f"{'on' if direct else 'off'}, timeout {timeout:g} s")
        note = bootstrap.unauthenticated_note(topo)
        if note:
            _log(1, f"{prefix}: {note}")
    return Communicator(core, store, prefix, rank, size, timeout)


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
