"""Ranks on several hosts of one machine: Linux network namespaces joined by real veth links.

``Namespaces(n, rate="1gbit")`` is a context manager around ``scripts/netns.sh``: it brings up
``n`` namespaces ("hosts", each with an interface ``veth0`` on one bridge, tbf-limited to
``rate``) and always removes them on the way out, also after a failure or KeyboardInterrupt.
``rails=R`` gives every host R such links (``veth0`` .. ``veth<R-1>``, each on its own bridge and
subnet, each limited to ``rate`` on its own: R NICs per host), and a rank uses the rail of its
local rank (local rank i listens on ``veth<i % R>``, as GPU i uses NIC i on a DGX).
Inside it, ``NetnsRankPool(net, hosts=[0, 0, 1])`` is a :class:`~commlib.testing.RankPool` whose
rank ``r`` runs in namespace ``hosts[r]`` (started with ``ip netns exec``), rendezvous like a real
multi-host job through a store that rank 0 serves on its namespace's address, and talks over TCP
across namespaces (shared memory within one).

Namespaces need root and a kernel that allows them; where either is missing, ``Namespaces``
raises :class:`NetnsUnavailable` (tests skip on it).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Dict, List, Optional, Sequence

from commlib.testing.ranks import PACKAGE_PARENT, RankFailure, RankPool

SCRIPT = os.path.join(PACKAGE_PARENT, "scripts", "netns.sh")
STORE_PORT = 29500  # free for sure: the namespace is new and holds nothing but these ranks


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``, or the kernel refuses)."""


class Namespaces:
    """``n`` network namespaces made by scripts/netns.sh; see the module docstring.

    After entering, ``hosts`` holds one dict per namespace (``netns``, ``ifname``, ``addr``),
    ``prefix`` the names' common prefix and ``hub`` the namespace of the bridge.
    """

    def __init__(self, n: int, rate: Optional[str] = None, prefix: Optional[str] = None, rails: int = 1):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n: expected a positive number of namespaces, got {n!r}")
        if not isinstance(rails, int) or not 1 <= rails <= 8:
            raise ValueError(f"rails: expected 1..8 links per host, got {rails!r}")
        self.n = n
        self.rate = rate
        self.rails = rails
        # Unique per process and per instance, so parallel test runs and nested uses never collide.
        Namespaces._count = getattr(Namespaces, "_count", 0) + 1
        self.prefix = prefix or f"cl{os.getpid()}n{Namespaces._count}"
        self.hosts: List[Dict] = []
        self.hub = ""

    def __enter__(self) -> "Namespaces":
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        if shutil.which("ip") is None or (self.rate and shutil.which("tc") is None):
            raise NetnsUnavailable("iproute2 (ip" + (", tc" if self.rate else "") + ") is not installed")
        if not os.path.exists(SCRIPT):
            raise NetnsUnavailable(f"{SCRIPT} is missing (commlib.testing.netns runs from a checkout)")
        argv = [SCRIPT, "up", str(self.n), "--prefix", self.prefix, "--rails", str(self.rails)]
        argv += ["--rate", self.rate] if self.rate else []
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except BaseException:
            self._down()
            raise
        if out.returncode != 0:
            self._down()
            raise NetnsUnavailable(f"scripts/netns.sh up failed: {out.stderr.strip()}")
        made = json.loads(out.stdout)
        self.hosts, self.hub = made["hosts"], made["hub"]
        return self

    def __exit__(self, *exc):
        self._down()
        return False

    def _down(self):
        subprocess.run([SCRIPT, "down", self.prefix], capture_output=True, timeout=60)

    def remaining(self) -> List[str]:
        """Namespaces with this prefix that exist now (empty after the context is left)."""
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
        return [line.split()[0] for line in out if line.startswith(self.prefix + "-")]

    def exec_argv(self, host: int, argv: Sequence[str]) -> List[str]:
        """The command line that runs ``argv`` on host ``host``."""
        return ["ip", "netns", "exec", self.hosts[host]["netns"], *argv]

    def rank_env(self, host: int, local_rank: int = 0) -> Dict[str, str]:
        """What a rank on ``host`` needs: its host's identity (namespaces share the hostname) and
        the interface that leads to the other hosts (its rail: ``local_rank % rails``)."""
        ifname = self.hosts[host]["ifnames"][local_rank % self.rails]
        return {"COMMLIB_HOST_ID": self.hosts[host]["netns"], "COMMLIB_SOCKET_IFNAME": ifname}

    def ip(self, host: int, *args: str) -> None:
        """Runs ``ip ARGS`` inside host ``host`` (e.g. ``net.ip(1, "link", "set", "veth0", "down")``)."""
        subprocess.run(["ip", "-n", self.hosts[host]["netns"], *args], check=True, capture_output=True, timeout=30)


_AVAILABLE: Optional[str] = None


def unavailable_reason() -> str:
    """"" when network namespaces can be made here, else why not (tried once per process)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        try:
            with Namespaces(1):
                pass
            _AVAILABLE = ""
        except NetnsUnavailable as e:
            _AVAILABLE = str(e)
    return _AVAILABLE


class _Process:
    """A rank started with ``ip netns exec``, with the few methods RankPool uses of a Process."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exitcode(self):
        return self.popen.poll()

    def kill(self):
        self.popen.kill()

    def join(self, timeout=None):
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


class NetnsRankPool(RankPool):
    """A RankPool whose rank ``r`` runs in namespace ``hosts[r]`` of ``net``.

    Each rank is told what torchrun would tell it (RANK, WORLD_SIZE, MASTER_ADDR = rank 0's
    namespace address, MASTER_PORT) plus ``net.rank_env``, and calls ``commlib.init()`` with no
    store: rank 0 serves the rendezvous store, reachable from every namespace. Ranks reach the pool
    over a Unix socket in a private directory (a path, unlike a TCP port, is visible from every
    network namespace). ``env`` values may be tuples (one per rank), as for RankPool.
    """

    def __init__(self, net: Namespaces, hosts: Sequence[int], timeout: float = 60.0, env: Optional[dict] = None):
        if not hosts or any(not 0 <= h < len(net.hosts) for h in hosts):
            raise ValueError(f"hosts: expected one namespace index in [0, {len(net.hosts)}) per rank, got {hosts!r}")
        self.net = net
        self.hosts = list(hosts)
        super().__init__(len(hosts), timeout=timeout, env=env)

    def _start_ranks(self):
        tmp = tempfile.mkdtemp(prefix="commlib-netns-")  # 0700: only this user reaches the socket
        path = os.path.join(tmp, "pool.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(path)
            listener.listen(self.size)
            master = self.net.hosts[self.hosts[0]]["addr"]
            for r, h in enumerate(self.hosts):
                env = dict(os.environ)
                env.update(self.net.rank_env(h, self.hosts[:r].count(h)))  # the pool's env may override these
                env.update({k: str(v[r] if isinstance(v, tuple) else v) for k, v in self.env.items()})
                env.update({"RANK": str(r), "WORLD_SIZE": str(self.size), "MASTER_ADDR": master,
                            "MASTER_PORT": str(STORE_PORT)})
                env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
                argv = self.net.exec_argv(h, [sys.executable, "-m", "commlib.testing.netns_rank", path])
                self.procs.append(_Process(subprocess.Popen(argv, env=env, cwd=PACKAGE_PARENT)))
            self.conns = self._accept(listener)
        finally:
            listener.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def _accept(self, listener) -> List[Connection]:
        """One connection per rank, in rank order (each rank first sends its rank number)."""
        conns: List[Optional[Connection]] = [None] * self.size
        deadline = time.monotonic() + self.timeout
        listener.settimeout(0.2)
        while any(c is None for c in conns):
            dead = [r for r, p in enumerate(self.procs) if conns[r] is None and not p.is_alive()]
            if dead:
                raise RankFailure(f"start-up: rank {dead[0]} exited ({self.procs[dead[0]].exitcode}) "
                                  "before reaching the pool")
            if time.monotonic() > deadline:
                raise RankFailure(f"start-up: ranks {[r for r, c in enumerate(conns) if c is None]} "
                                  f"did not reach the pool within {self.timeout:.0f} s")
            try:
                s, _ = listener.accept()
            except socket.timeout:
                continue
            s.settimeout(None)
            conn = Connection(s.detach())
            rank = conn.recv()
            conns[rank] = conn
        return conns
