"""A/B of TCP striping (COMMLIB_TCP_NCONNS) in one run: the same two ranks, in two network
namespaces joined by veth (scripts/netns.sh, root only), hold one sub-communicator per lane count
and take turns call by call, so every lane count sees the same load.

    python bench/tcp_lanes_ab.py [--lanes 1,2,4] [--reps 15] [--rate 1gbit] [--ranks-per-host 1]

Prints, per operation and lane count, the median over calls of the slowest rank's time and the
ratio to one lane. Operations: all_reduce of 16 MiB float32 (ring: both directions at once),
broadcast of 16 MiB (one direction), all_reduce of 8 B (latency), and the peer that bounds what
striping can win here: 16 MiB sent one way by plain Python sockets over the same link, split over
`lanes` connections, one thread per connection at each end.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OPS = ("all_reduce 16 MiB", "broadcast 16 MiB", "all_reduce 8 B", "raw TCP 16 MiB")


def _raw_flows(comm, lanes):
    """Rank 0 listens next to its commlib listener; rank 1 opens max(lanes) connections. Returns
    a function moving 16 MiB from rank 0 to rank 1 over the first n of them, a thread each."""
    from concurrent.futures import ThreadPoolExecutor

    where = np.zeros(64, np.uint8)  # rank 0's "host:port", broadcast
    if comm.rank == 0:
        lst = socket.create_server((comm._core.tcp_address().rsplit(":", 1)[0].strip("[]"), 0))
        name = f"{lst.getsockname()[0]}:{lst.getsockname()[1]}".encode()
        where[:len(name)] = np.frombuffer(name, np.uint8)
    comm.broadcast(where, root=0)
    host, port = bytes(where).rstrip(b"\0").decode().rsplit(":", 1)
    if comm.rank == 0:
        socks = [lst.accept()[0] for _ in range(max(lanes))]
        lst.close()
    else:
        socks = [socket.create_connection((host, int(port))) for _ in range(max(lanes))]
    for s in socks:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    data = bytearray(16 << 20)
    pool = ThreadPoolExecutor(max(lanes))

    def part(i, n):
        view = memoryview(data)[i * len(data) // n:(i + 1) * len(data) // n]
        if comm.rank == 0:
            socks[i].sendall(view)
        else:
            while len(view):
                got = socks[i].recv_into(view)
                view = view[got:]

    def move(n):
        if comm.rank < 2:
            list(pool.map(part, range(n), [n] * n))

    def close():
        pool.shutdown()
        for s in socks:
            s.close()

    return move, close


def _rank_main(comm, lanes, reps):
    subs = {}
    for n in lanes:  # the lane count is read when a communicator's TCP links are made
        os.environ["COMMLIB_TCP_NCONNS"] = str(n)
        subs[n] = comm.split(0)
    big = np.ones(4 << 20, np.float32)
    out = np.empty_like(big)
    small = np.ones(2, np.float32)
    ops = {
        OPS[0]: lambda s: s.all_reduce(big, out=out, algorithm="ring"),
        OPS[1]: lambda s: s.broadcast(big, root=0),
        OPS[2]: lambda s: s.all_reduce(small, algorithm="ring"),
    }
    raw, raw_close = _raw_flows(comm, lanes)
    ops[OPS[3]] = None
    times = {(op, n): [] for op in OPS for n in lanes}
    for rep in range(reps + 1):
        order = list(lanes) if rep % 2 else list(reversed(lanes))
        for op, fn in ops.items():
            inner = 50 if op == OPS[2] else 1
            for n in order:
                s = subs[n]
                s.barrier()
                t = time.perf_counter()
                for _ in range(inner):
                    fn(s) if fn else raw(n)
                if not fn:
                    s.barrier()  # the receiver has it all
                if rep:  # the first round warms up
                    times[(op, n)].append((time.perf_counter() - t) / inner)
    raw_close()
    for s in subs.values():
        s.close()
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lanes", default="1,2,4")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--rate", default=None)
    p.add_argument("--ranks-per-host", type=int, default=1)
    a = p.parse_args()
    lanes = [int(x) for x in a.lanes.split(",")]
    from commlib.testing.netns import Namespaces, NetnsRankPool

    # The ranks import this file by module name (not as __main__).
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, here)
    import tcp_lanes_ab as me

    with Namespaces(2, rate=a.rate) as net:
        pool = NetnsRankPool(net, hosts=[0] * a.ranks_per_host + [1] * a.ranks_per_host, timeout=600)
        try:
            res = pool.run(me._rank_main, lanes, a.reps, timeout=590)
        finally:
            pool.close()
    load = os.getloadavg()[0]
    print(f"# 2 hosts x {a.ranks_per_host} rank(s), veth, rate {a.rate or 'unlimited'}, {a.reps} rounds, "
          f"load average now {load:.1f}")
    for op in OPS:
        base = None
        for n in lanes:
            slowest = [max(r[(op, n)][i] for r in res) for i in range(len(res[0][(op, n)]))]
            med = statistics.median(slowest)
            base = base or med
            unit, scale = ("us", 1e6) if "8 B" in op else ("ms", 1e3)
            print(f"{op:20s} lanes={n}  median {med * scale:9.2f} {unit}  (min {min(slowest) * scale:9.2f})  "
                  f"1-lane / this = {base / med:.2f}x")


if __name__ == "__main__":
    main()
