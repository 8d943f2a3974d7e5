"""Hand the shared-memory region's descriptor from a host's leader to the other ranks of its host.

The leader (the host's lowest rank: rank 0 on a single host) listens on an abstract Unix socket
(no file system name; the name carries 128 random bits and is published through the store) and
sends the memfd itself with SCM_RIGHTS. Both ends check the other's credentials with SO_PEERCRED:
the leader serves only processes of its own user, a rank accepts a descriptor only from the pid the
leader published and only if that process runs as its own user. No path is ever built from a store
value (the earlier design opened /proc/<pid>/fd/<n>, which a forged store value could point
anywhere). Errors name global ranks and, on a multi-host job, the host.
"""
from __future__ import annotations

import os
import secrets
import socket
import struct
import time

from commlib.errors import RendezvousError

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_RANK = struct.Struct("!I")
_POLL_S = 0.1  # the longest a wait for the leader goes without calling poll()


def peer_credentials(sock) -> tuple:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket."""
    return _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))


class FdServer:
    """Rank 0's end: ``name`` goes into the store; ``serve_one`` hands ``fd`` to one rank."""

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size
        self.name = "commlib-" + secrets.token_hex(16)
        self.served: set = set()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._sock.bind("\0" + self.name)
        self._sock.listen(max(8, min(size, 1024)))

    def serve_one(self, wait: float) -> bool:
        """Accept one connection within ``wait`` seconds and serve it; False when none came.

        Connections from another user, or that name no rank still waiting, are closed unserved.
        """
        self._sock.settimeout(wait)
        try:
            conn, _ = self._sock.accept()
        except socket.timeout:
            return False
        with conn:
            conn.settimeout(5.0)
            try:
                _, uid, _ = peer_credentials(conn)
                if uid != os.getuid():
                    return True
                raw = conn.recv(_RANK.size, socket.MSG_WAITALL)
                if len(raw) != _RANK.size:
                    return True
                (rank,) = _RANK.unpack(raw)
                if not 0 < rank < self.size or rank in self.served:
                    return True
                socket.send_fds(conn, [b"F"], [self.fd])
                self.served.add(rank)
            except OSError:
                pass
        return True

    def close(self):
        self._sock.close()


def receive_fd(name: str, pid: int, local_rank: int, timeout: float, *, rank: int | None = None,
               leader: int = 0, host: str | None = None, poll=None) -> int:
    """The end of local rank ``local_rank`` (> 0) of a host: connect to the host leader's socket
    ``name``, check it is process ``pid`` of this user, and return the descriptor it sends.

    Errors name the global ``rank`` and ``leader`` and the ``host`` (on a multi-host job the local
    rank alone does not say which process failed); they default to the local numbering.
    ``poll()`` runs while waiting (every 0.1 s at most) and may raise: the rendezvous' check for
    an error another rank reported, so a leader that gave up is not waited for until the timeout.
    """
    me = f"rank {local_rank if rank is None else rank}" + (f" on host {host}" if host else "")
    them = f"rank {leader}" + (" (the host's leader)" if host else "")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    with sock:
        sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                sock.connect("\0" + name)
                break
            except (ConnectionRefusedError, FileNotFoundError) as e:
                if time.monotonic() > deadline:
                    raise RendezvousError(f"{me}: cannot reach the descriptor socket of {them} ({e})") from None
                if poll is not None:
                    poll()
                time.sleep(0.01)
        peer_pid, uid, _ = peer_credentials(sock)
        if uid != os.getuid() or peer_pid != pid:
            raise RendezvousError(f"{me}: the descriptor socket named in the store belongs to pid "
                                  f"{peer_pid} of uid {uid}, not to {them} (pid {pid}, uid {os.getuid()}); "
                                  "refusing it")
        sock.sendall(_RANK.pack(local_rank))
        while True:
            sock.settimeout(max(0.001, min(_POLL_S, deadline - time.monotonic())))
            try:
                msg, fds, _, _ = socket.recv_fds(sock, 1, 4)
                break
            except socket.timeout:
                if time.monotonic() > deadline:
                    raise RendezvousError(f"{me}: {them} did not send the region descriptor within "
                                          f"{timeout:g} s") from None
                if poll is not None:
                    poll()
        for extra in fds[1:]:
            os.close(extra)
        if msg != b"F" or not fds:
            for f in fds[:1]:
                os.close(f)
            raise RendezvousError(f"{me}: {them} refused to send the region descriptor")
        return fds[0]
