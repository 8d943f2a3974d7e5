"""A free TCP port for a rendezvous that processes agree on before any of them listens.

The usual probe (bind port 0, read the port, close) hands back a port from the kernel's ephemeral
range, the same range every other bind(0) and every outgoing connection draws from: between the
probe's close and the store's listen, another process on the machine may be given that very port
(seen in CI as EADDRINUSE from a torch TCPStore while other tests connected and probed in parallel).
``free_port`` draws at random from the ports *below* the ephemeral range instead, which the kernel
never hands out by itself, and checks each by binding it; two such pickers collide only by choosing
the same port within the same seconds (about 1 in 20,000 per pair).
"""
from __future__ import annotations

import random
import socket

_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST = 10000  # below this: well-known and commonly configured service ports
_TRIES = 200


def ephemeral_range() -> tuple[int, int]:
    """(first, last) port the kernel hands out for bind(0) and connect(); Linux's default elsewhere."""
    try:
        with open(_EPHEMERAL_RANGE_FILE) as f:
            first, last = (int(v) for v in f.read().split())
        return first, last
    except (OSError, ValueError):
        return 32768, 60999


def _candidates() -> tuple[int, int]:
    first, last = ephemeral_range()
    if first - _LOWEST >= 1000:
        return _LOWEST, first - 1
    return last + 1, 65535  # a range set low: draw above it


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing is bound to now, drawn outside the ephemeral range (see the
    module's note); the kernel's bind(0) pick only if none of 200 draws is free."""
    lo, hi = _candidates()
    draw = random.SystemRandom()
    for _ in range(_TRIES):
        port = draw.randint(lo, hi)
        if _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports (``free_port`` each)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port(host)
        if port not in ports:
            ports.append(port)
    return ports
