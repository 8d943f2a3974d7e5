"""Where the ranks of a local ``commlib bench`` run live, and over which links they talk.

* one host (``--hosts 1``): every rank on this machine, shared memory between them;
* emulated hosts (``--hosts H``): contiguous groups of ranks get their own ``COMMLIB_HOST_ID``;
  commlib uses shared memory inside a group and TCP over loopback (``COMMLIB_SOCKET_IFNAME=lo``)
  between groups;
* network namespaces (``--hosts H --netns [--rate R]``): each group runs in its own Linux network
  namespace made by scripts/netns.sh (root only), started with ``ip netns exec``; hosts reach each
  other only through veth links to a bridge, tbf-limited to ``R`` each way. Every backend gets the
  same links: commlib and gloo use ``veth0`` (COMMLIB_SOCKET_IFNAME, GLOO_SOCKET_IFNAME), and Open
  MPI (``--mca btl tcp,self``, ``btl_tcp_if_include veth0``) is launched as across machines: mpirun
  runs on host 0 and starts its daemon on every other host through ``scripts/netns.sh rsh``.

:class:`Placement` turns a rank's command into the command and environment that put it there.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from commlib.bootstrap.ports import free_port

NETNS_PORT = 29500  # first rendezvous port inside fresh namespaces (nothing else listens there)


def host_of_ranks(P: int, hosts: int) -> List[int]:
    """Host of each of P ranks: contiguous groups, the first P % hosts one rank larger."""
    out = []
    for h in range(hosts):
        out += [h] * (P // hosts + (h < P % hosts))
    return out


class Placement:
    """Ranks 0..P-1 on ``hosts`` hosts; ``net`` (a commlib.testing.netns.Namespaces that is up)
    puts host h in namespace ``net.hosts[h]``, else the hosts are emulated on this namespace."""

    def __init__(self, P: int, hosts: int = 1, net=None, rate: Optional[str] = None):
        self.P, self.hosts, self.net, self.rate = P, hosts, net, rate
        self.host_of = host_of_ranks(P, hosts)
        self._next_port = NETNS_PORT

    def links(self) -> str:
        """Between which hosts the ranks run, in words; each backend's ``transport`` (shm, tcp,
        shm+tcp) says which links it used on them. The bench header and the JSON carry both."""
        if self.hosts == 1:
            return "one host"
        if self.net is None:
            return f"lo between {self.hosts} emulated hosts (COMMLIB_HOST_ID)"
        rate = f", tbf {self.rate} each way" if self.rate else ", no rate limit"
        return f"veth between {self.hosts} network namespaces{rate}"

    def _rendezvous(self) -> Tuple[str, int]:
        if self.net is None:
            return "127.0.0.1", free_port()
        # A new port per job: the previous job's store port may still be in TIME_WAIT.
        self._next_port += 2
        return self.net.hosts[0]["addr"], self._next_port

    def rank_commands(self, argv: List[str], base_env) -> List[Tuple[List[str], Dict[str, str]]]:
        """(command, environment) of every rank of one job running ``argv``; ``base_env(extra)``
        makes the environment (the launcher's, with PYTHONPATH)."""
        addr, port = self._rendezvous()
        out = []
        for r in range(self.P):
            h = self.host_of[r]
            local = self.host_of[:r].count(h)
            env = base_env({"RANK": str(r), "WORLD_SIZE": str(self.P), "LOCAL_RANK": str(local),
                            "LOCAL_WORLD_SIZE": str(self.host_of.count(h)), "MASTER_ADDR": addr,
                            "MASTER_PORT": str(port)})
            cmd = list(argv)
            if self.net is not None:
                ns = self.net.hosts[h]
                env["COMMLIB_HOST_ID"] = ns["netns"]  # namespaces share the hostname
                env.setdefault("COMMLIB_SOCKET_IFNAME", ns["ifname"])
                env.setdefault("GLOO_SOCKET_IFNAME", ns["ifname"])
                # torch's store warns on every connection that the namespace address has no name.
                env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
                cmd = self.net.exec_argv(h, cmd)
            elif self.hosts > 1:
                env["COMMLIB_HOST_ID"] = f"host{h}"
                env.setdefault("COMMLIB_SOCKET_IFNAME", "lo")
            out.append((cmd, env))
        return out

    def mpi_command(self, cmd: List[str]) -> Tuple[List[str], Dict[str, str]]:
        """``cmd`` (``mpirun ... python ...``) adjusted to cross the same links as commlib's
        inter-host traffic, and the environment it needs."""
        cmd = list(cmd)
        if self.hosts == 1:
            return cmd, {}
        opts = ["--mca", "btl", "tcp,self"]  # TCP between every pair, like gloo and commlib across hosts
        if self.net is None:
            return cmd[:1] + opts + cmd[1:], {}
        from commlib.testing.netns import SCRIPT
        ifname = self.net.hosts[0]["ifname"]
        slots = ",".join(f"{self.net.hosts[h]['addr']}:{self.host_of.count(h)}" for h in range(self.hosts))
        opts += ["--mca", "btl_tcp_if_include", ifname, "--mca", "oob_tcp_if_include", ifname,
                 "--mca", "plm_rsh_agent", f"{SCRIPT} rsh", "--host", slots]
        return self.net.exec_argv(0, cmd[:1] + opts + cmd[1:]), {"NETNS_PREFIX": self.net.prefix}
