"""Rendezvous: find the ranks, share the shared-memory region, build communicators.

Ranks on one host share a region; ranks on different hosts talk over TCP (commlib.bootstrap.hosts finds
the hosts and exchanges the TCP addresses). Each host's lowest rank (its leader) creates the
host's region as a memfd (anonymous: nothing appears in /dev/shm, and a crash leaves nothing
behind), sizes and seals it (it can no longer shrink or grow), and publishes a record of itself
through the store; the other ranks of the host receive the descriptor itself from their leader
over a Unix socket (commlib/bootstrap/fdpass.py), the C++ core checks it (a sealed memfd of our user, of the size and
layout this rank computed), maps it, and says so. Every value read from the store is parsed
strictly, and signed when COMMLIB_SECRET is set (commlib/bootstrap/secret.py). A rank that finds a problem
(a different world size, a malformed value) publishes it under ``<prefix>/error`` so every rank
raises ``RendezvousError`` naming it instead of waiting out the timeout.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from typing import Optional

from commlib import settings
import commlib._C as _C
from commlib.bootstrap import hosts as bootstrap, phases
from commlib.core.call_checks import as_int, as_seconds
from commlib.core import grow, shrink
from commlib.core.communicator import Communicator
from commlib.errors import CommError, RendezvousError
from commlib.bootstrap.fdpass import FdServer, receive_fd
from commlib.bootstrap.secret import secured, store_key
from commlib.bootstrap.store import StoreServer, TCPStore, external_address
from commlib.bootstrap.store_lease import StoreLease
from commlib.bootstrap.wait import error_text, wait_for_key

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
    Rendezvous uses ``store`` (any torch.distributed Store, or commlib.bootstrap.store.TCPStore) or, if none,
    the store at ``master_addr``/``master_port`` when given, else the one ``COMMLIB_STORE=host:port``
    names (served outside the ranks by ``commlib store``, so it outlives any rank), else a store at
    MASTER_ADDR:MASTER_PORT (default 127.0.0.1:29500): torchrun's agent store when running under
    torchrun, else one that rank 0 serves (which dies with rank 0). ``timeout`` (seconds, default
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
    world_size = as_int(world_size, "world_size")  # np.int64 passes; bools and floats do not
    if world_size < 1:
        raise ValueError(f"world_size: must be a positive integer, got {world_size!r}")
    rank = as_int(rank, "rank")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: {rank!r} is out of range for world_size {world_size}")
    timeout = as_seconds(timeout)
    if timeout is None:
        timeout = default_timeout()
    debug_level()  # a bad COMMLIB_DEBUG is refused before any store is served or reached
    owned = store is None
    server = None
    if owned:
        store, server = _default_store(rank, world_size, master_addr, master_port, timeout)
    try:
        comm = create(store, prefix, rank, world_size, timeout)
    except BaseException:
        if owned:  # a failed rendezvous leaves nothing open behind it
            store.close()
            if server is not None:
                server.close()
        raise
    if owned:  # shared with every communicator built over it; the last one closed closes it
        comm._hold_store(StoreLease(store, server, timeout))
    return comm


def _default_store(rank, world_size, master_addr, master_port, timeout):
    external = external_address() if master_addr is None and master_port is None else None
    if external is not None:  # `commlib store` serves it: every rank is a client, none serves
        return TCPStore(*external, timeout=timeout, connect_timeout=timeout), None
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
        # Bind only the address asked for (not 0.0.0.0): where the ranks were told to look for it.
        try:
            # With COMMLIB_SECRET the server stores only values signed with the job's key.
            server = StoreServer("127.0.0.1" if addr == "localhost" else addr, port, key=store_key())
        except OSError as e:
            raise RendezvousError(f"master_port: rank 0 cannot serve the rendezvous store on {addr}:{port} "
                                  f"({e.strerror}); pick a free MASTER_PORT") from None
    # Port 0 lets rank 0 pick a free port (useful for a world of one).
    try:
        return TCPStore(addr, server.port if server else port, timeout=timeout, connect_timeout=timeout,
                        served_by_rank0=True), server
    except BaseException:
        if server is not None:
            server.close()
        raise


class _Rendezvous:
    """Keys under one prefix, waited on with a deadline while watching ``<prefix>/error`` (and
    calling ``check()``, which may raise, e.g. a shrink's check that no survivor died)."""

    def __init__(self, store, prefix: str, rank: int, timeout: float, watch=(), check=None):
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        # Other prefixes whose errors end this rendezvous too: a split's child watches its parent's,
        # so a rank that refused a split entry stops the ranks already in the child rendezvous.
        self.watch = (prefix,) + tuple(watch)
        self.check = check

    def set(self, name: str, value):
        self.store.set(f"{self.prefix}/{name}", value)

    def wait(self, name: str, what: str) -> bytes:
        """The value of ``name`` once set; RendezvousError if a rank reported an error first or
        the deadline passes (``what`` says what was expected)."""
        return wait_for_key(
            self.store, f"{self.prefix}/{name}", self.deadline, poll=self.raise_reported,
            on_timeout=lambda: RendezvousError(f"rendezvous {self.prefix!r}: rank {self.rank} waited "
                                               f"{self.timeout:g} s (COMMLIB_TIMEOUT) for {what}"))

    def raise_reported(self):
        """Raise RendezvousError if some rank reported an error under this prefix (or a watched one),
        or whatever ``check()`` raises."""
        for prefix in self.watch:
            err = f"{prefix}/error"
            if self.store.check([err]):
                raise RendezvousError(f"rendezvous {prefix!r}: " + error_text(self.store.get(err)))
        if self.check is not None:
            self.check()

    def report(self, message: str):
        """Tell every rank what went wrong here (best effort: the store may be the problem)."""
        try:
            self.store.set(f"{self.prefix}/error", f"rank {self.rank}: {message}")
        except Exception:  # noqa: BLE001 - the original error is what the caller raises
            pass


def _parse_record(raw: bytes, fields: dict, what: str) -> dict:
    """A JSON object with exactly ``fields`` (name -> type or tuple of types); bools are not ints."""
    try:
        rec = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RendezvousError(f"{what}: malformed value {error_text(raw)[:80]!r} in the store") from None
    if not isinstance(rec, dict) or set(rec) != set(fields):
        raise RendezvousError(f"{what}: expected fields {sorted(fields)}, got {error_text(raw)[:80]!r}")
    for name, types in fields.items():
        v = rec[name]
        if isinstance(v, bool) or not isinstance(v, types):
            raise RendezvousError(f"{what}: field {name!r} has a bad value {v!r}")
    return rec


def _make_region(size: int, prefix: str) -> int:
    """A zero-filled, sealed memfd of the region's size: it can no longer shrink or grow."""
    # The name shows in /proc/<pid>/maps, which is how tests find a communicator's region.
    fd = os.memfd_create(f"commlib:{prefix}"[:240], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, _C.shm_region_bytes(size))
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


_REGION_FIELDS = {"pid": int, "size": int, "host": str, "socket": str, "bytes": int}


def create(store, prefix: str, rank: int, size: int, timeout: float, watch=(), check=None) -> Communicator:
    """Build a communicator of ``size`` ranks over ``store`` keys under ``prefix`` (collective).
    An error reported under any prefix in ``watch`` ends the rendezvous too; ``check()`` runs while
    waiting on peers and may raise to stop it (a shrink's check that no survivor died)."""
    store = secured(store)
    rdv = _Rendezvous(store, prefix, rank, timeout, watch, check)
    try:
        core, direct = _create_core(rdv, rank, size, timeout)
    except (CommError, ValueError, OSError) as e:
        if not any(str(e).startswith(f"rendezvous {p!r}: rank ") for p in rdv.watch):  # not a relayed report
            rdv.report(str(e))
        if not isinstance(e, OSError):  # CommErrors, and ValueErrors naming a bad setting
            raise
        raise RendezvousError(f"rendezvous {prefix!r} on rank {rank}: {e}") from e
    if rank == 0:
        topo = core_topology(core)
        links = "shm" if len(topo.hosts) == 1 else "shm within hosts, tcp across"
        single = "on" if direct else f"off ({core.direct_reads_reason() or 'no peer on this host'})"
        _log(1, f"{prefix}: {size} ranks on {topo}, transport {links}, single-copy reads {single}, timeout {timeout:g} s")
        note = bootstrap.unauthenticated_note(topo)
        if note:
            _log(1, f"{prefix}: {note}")
    return Communicator(core, store, prefix, rank, size, timeout, split=split_communicator,
                        shrink=shrink_communicator, grow=grow_communicator)


def _set_cost_model(core, size: int) -> None:
    """COMMLIB_TOPOLOGY: auto ranks its candidates with the simulator on this topology's links (the
    placement is the communicator's host map). Every rank loads the same file, so all choose alike."""
    spec = settings.get("COMMLIB_TOPOLOGY")
    if not spec:
        return
    from commlib.sim import topology as sim_topology  # only when asked: the simulator's Python side
    try:
        model = sim_topology.load(spec)
    except Exception as e:
        raise ValueError(f"COMMLIB_TOPOLOGY: {e}") from None
    core.set_cost_model(model.engine_dict(size))


def core_topology(core) -> "bootstrap.Topology":
    return bootstrap.Topology(list(core.host_names), list(core.host_of), list(core.link_kinds))


def _create_core(rdv: _Rendezvous, rank: int, size: int, timeout: float):
    topo = bootstrap.discover_hosts(rdv, rank, size)
    phases.reached(rdv.prefix, "hosts")
    hidx = topo.host_of[rank]
    local = topo.ranks_on(hidx)
    local_size, leader, local_rank = len(local), local[0], local.index(rank)
    host = topo.hosts[hidx]
    region_bytes = _C.shm_region_bytes(local_size)
    # Host 0 (rank 0's) keeps the single-host key names ("shm", "ready"); other hosts add "/<host>".
    shm_key, ready_key = ("shm", "ready") if hidx == 0 else (f"shm/{hidx}", f"ready/{hidx}")
    endpoint = None
    if len(topo.hosts) > 1:  # listen before the address is published; connect once all listen
        endpoint = bootstrap.listen(rdv, rank, topo, timeout, debug_level())

    def make_core(fd):
        core = _C.Communicator(rank, size, fd, topo.host_of, topo.hosts, endpoint, timeout, rdv.prefix,
                               debug_level())
        _set_cost_model(core, size)
        return core

    if rank == leader:
        fd = _make_region(local_size, rdv.prefix)
        server = None
        try:
            # The leader lays out the region before anyone may receive it.
            core = make_core(fd)
            if local_size > 1:
                server = FdServer(fd, local_size)  # serves local ranks 1..local_size-1
                rdv.set(shm_key, json.dumps({"pid": os.getpid(), "size": size, "host": host,
                                                   "socket": server.name, "bytes": region_bytes}))
                while len(server.served) < local_size - 1:
                    rdv.raise_reported()
                    if time.monotonic() > rdv.deadline:
                        missing = sorted(local[i] for i in set(range(1, local_size)) - server.served)
                        raise RendezvousError(f"rendezvous {rdv.prefix!r}: ranks {missing} did not fetch the "
                                              f"shared-memory region within {timeout:g} s (COMMLIB_TIMEOUT)")
                    server.serve_one(0.05)
        finally:
            if server is not None:
                server.close()
            os.close(fd)  # the mapping keeps the region; peers hold their own descriptors
    else:
        rec = _parse_record(rdv.wait(shm_key, f"rank {leader} to publish host {host}'s shared-memory region"),
                            _REGION_FIELDS, f"rendezvous {rdv.prefix!r}: rank {leader}'s region record")
        if rec["size"] != size:
            raise RendezvousError(f"world size mismatch: rank {rank} has world_size {size} but rank {leader} has "
                                  f"{rec['size']} (check WORLD_SIZE on every rank)")
        if rec["host"] != host:
            raise RendezvousError(f"rank {rank} on host {host} got the region record of host {rec['host']!r}")
        if rec["bytes"] != region_bytes:
            raise RendezvousError(f"rank {rank} computed a {region_bytes}-byte region but rank {leader} made "
                                  f"{rec['bytes']} bytes (COMMLIB_SHM_SLOTS / COMMLIB_SHM_SLOT_BYTES / "
                                  "COMMLIB_SHM_BCAST_BYTES must be the same on every rank)")
        fd = receive_fd(rec["socket"], rec["pid"], local_rank, max(0.1, rdv.deadline - time.monotonic()),
                        rank=rank, leader=leader, host=host if len(topo.hosts) > 1 else None,
                        poll=rdv.raise_reported)
        try:
            core = make_core(fd)
        finally:
            os.close(fd)
    try:
        # Every rank of the host mapped the region and published its pid once the leader says ready.
        rdv.set(f"mapped/{rank}", b"1")
        phases.reached(rdv.prefix, "mapped")
        if rank == leader:
            for r in local[1:]:
                _expect_flag(rdv, f"mapped/{r}", f"rank {r} to map the region")
            rdv.set(ready_key, b"1")
        else:
            _expect_flag(rdv, ready_key, f"rank {leader} to see every rank of host {host} mapped")
        if endpoint is not None:
            core.connect(bootstrap.addresses(rdv, rank, topo), poll=rdv.raise_reported)  # a dead peer fails it
    except BaseException:
        core.close()  # now, not at garbage collection: peers that got further see this rank close
        raise
    phases.reached(rdv.prefix, "created")
    # Probe single-copy reads (peers keep sending through the channels until they see our answer).
    return core, core.enable_direct_reads()


def _expect_flag(rdv: _Rendezvous, name: str, what: str):
    v = rdv.wait(name, what)
    if v != b"1":
        raise RendezvousError(f"rendezvous {rdv.prefix!r}: key {name!r} holds {error_text(v)[:40]!r}, expected '1'")


def split_communicator(comm: Communicator, color, key: int, n: int, timeout: float):
    """Implementation of Communicator.split (collective over ``comm``)."""
    prefix = f"{comm._prefix}/split{n}"
    rdv = _Rendezvous(comm._store, prefix, comm.rank, timeout)
    rdv.set(f"in/{comm.rank}", json.dumps({"color": color, "key": key}))
    entries = []
    try:
        for r in range(comm.size):
            rec = _parse_record(rdv.wait(f"in/{r}", f"rank {r} to call split"),
                                {"color": (int, type(None)), "key": int},
                                f"split #{n}: rank {r}'s entry")
            if rec["color"] is not None and rec["color"] < 0:
                raise RendezvousError(f"split #{n}: rank {r}'s entry has a negative color")
            entries.append((rec["color"], rec["key"], r))
    except RendezvousError as e:
        rdv.report(str(e))
        raise
    if color is None:
        return None
    members = sorted((k, r) for c, k, r in entries if c == color)
    new_rank = [r for _, r in members].index(comm.rank)
    return _shares_store(comm, create(comm._store, f"{prefix}/c{color}", new_rank, len(members), timeout,
                                      watch=(prefix,)))


def _shares_store(parent: Communicator, child: Communicator) -> Communicator:
    """``child`` (built over ``parent``'s store) holds init()'s store too, if ``parent`` does: closing
    either one first leaves the store to the other (commlib/bootstrap/store_lease.py)."""
    if parent._lease is not None:
        child._hold_store(parent._lease.acquire())
    return child


def _rebuilt(parent: Communicator, child: Communicator) -> Communicator:
    child._job = parent._job  # the survivors' or the grown communicator: joiners still name the job
    return _shares_store(parent, child)


def shrink_communicator(comm: Communicator, exclude, n: int, timeout: float):
    """Implementation of Communicator.shrink (commlib/core/shrink.py; collective over the survivors)."""
    return _rebuilt(comm, shrink.shrink(comm, exclude, n, timeout, _Rendezvous, create))


def grow_communicator(comm: Communicator, n, k: int, timeout: float):
    """Implementation of Communicator.grow (commlib/core/grow.py; collective over ``comm``)."""
    return _rebuilt(comm, grow.grow(comm, n, k, timeout, timeout, _Rendezvous, create))
