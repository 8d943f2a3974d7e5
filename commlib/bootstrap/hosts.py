"""Bootstrap over the store: who is on which host, and the TCP addresses of ranks on other hosts.

A rank's host is ``COMMLIB_HOST_ID`` if set (so one machine can act as several hosts in tests),
else its hostname. Ranks on one host share memory; ranks on different hosts talk over TCP. The
store only carries public facts (host names, listening addresses, a communicator id): it is
readable by anyone who reaches it, so the secret that authenticates links (``COMMLIB_SECRET``)
never goes through it.
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from typing import List, Optional

from commlib import settings
import commlib._C as _C

_HOST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_ADDRESS = re.compile(r"^(\d{1,3}(\.\d{1,3}){3}|\[[0-9A-Fa-f:.]+\]):\d{1,5}$")


def host_id() -> str:
    """This process's host identity: COMMLIB_HOST_ID, else the hostname."""
    v = settings.get("COMMLIB_HOST_ID")
    if v == "":
        return socket.gethostname()[:128]
    if not _HOST_ID.match(v):
        raise ValueError(f"COMMLIB_HOST_ID: expected 1-128 characters of [A-Za-z0-9._:-], got {v!r}")
    return v


@dataclass(frozen=True)
class Topology:
    """Where the ranks of a communicator are.

    ``hosts``: host names, in order of their lowest rank; ``host_of[r]``: rank r's host index;
    ``links[r]``: how this rank reaches rank r ("self", "shm" on its host, "tcp" across hosts).
    """

    hosts: List[str]
    host_of: List[int]
    links: List[str] = field(default_factory=list)

    def ranks_on(self, host: int) -> List[int]:
        """The ranks on host index ``host``, ascending."""
        return [r for r, h in enumerate(self.host_of) if h == host]

    @property
    def local_ranks(self) -> List[List[int]]:
        """Ranks grouped by host."""
        return [self.ranks_on(h) for h in range(len(self.hosts))]

    def __str__(self):
        parts = [f"{name}: ranks {self.ranks_on(h)}" for h, name in enumerate(self.hosts)]
        return f"{len(self.hosts)} host(s) ({'; '.join(parts)})"


def discover_hosts(rdv, rank: int, size: int) -> Topology:
    """Every rank publishes its host id and world size; all read everyone's (collective).

    ``rdv`` is commlib.init's rendezvous (set/wait/report under one prefix): waits end early with
    RendezvousError when any rank reported a problem, and a world-size disagreement is reported.
    """
    from commlib.errors import RendezvousError

    rdv.set(f"host/{rank}", f"{size}:{host_id()}".encode())
    names: List[str] = []
    host_of: List[int] = []
    for r in range(size):
        raw = rdv.wait(f"host/{r}", f"rank {r} to publish its host").decode(errors="replace")
        their_size, _, name = raw.partition(":")
        if their_size != str(size):
            raise RendezvousError(f"world size mismatch: rank {rank} has world_size {size} but rank {r} has "
                                  f"{their_size[:12]!r} (check WORLD_SIZE on every rank)")
        if not _HOST_ID.match(name):
            raise RendezvousError(f"rank {r} published an invalid host id {name[:64]!r}")
        if name not in names:
            names.append(name)
        host_of.append(names.index(name))
    return Topology(names, host_of)


def comm_id(rdv, rank: int) -> str:
    """An id rank 0 draws for this communicator; TCP handshakes refuse other communicators' ranks."""
    if rank == 0:
        rdv.set("comm_id", os.urandom(16).hex().encode())
    raw = rdv.wait("comm_id", "rank 0 to publish the communicator id").decode(errors="replace")
    return raw[:64] + "/" + rdv.prefix


def listen(rdv, rank: int, topo: Topology, timeout: float, debug: int):
    """Opens this rank's TCP listener and publishes its address (when other hosts exist)."""
    size = len(topo.host_of)
    mine = topo.host_of[rank]
    remote = [h != mine for h in topo.host_of]
    endpoint = _C.TcpEndpoint(rank, size, comm_id(rdv, rank), remote, timeout, debug)
    rdv.set(f"tcp/{rank}", endpoint.address.encode())
    return endpoint


def addresses(rdv, rank: int, topo: Topology) -> List[str]:
    """Every rank's listening address ("" for ranks on this rank's host), checked strictly."""
    from commlib.errors import RendezvousError

    out = []
    mine = topo.host_of[rank]
    for r, h in enumerate(topo.host_of):
        if h == mine:
            out.append("")
            continue
        a = rdv.wait(f"tcp/{r}", f"rank {r} to publish its TCP address").decode(errors="replace")
        if not _ADDRESS.match(a):
            raise RendezvousError(f"rank {r} published an invalid TCP address {a[:64]!r}")
        out.append(a)
    return out


def unauthenticated_note(topo: Topology) -> Optional[str]:
    """The INFO line a multi-host job without COMMLIB_SECRET logs, else None."""
    if len(topo.hosts) > 1 and not settings.get("COMMLIB_SECRET"):
        return ("links between hosts are unauthenticated: set COMMLIB_SECRET (the same on every rank) "
                "so every TCP connection proves it belongs to this job")
    return None
