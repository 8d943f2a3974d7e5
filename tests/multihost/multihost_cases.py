"""Rank-side checks for ranks spread over emulated hosts (COMMLIB_HOST_ID per rank).

Values are small integers (exact in float32: sums of at most 8 ranks' values stay far below 2^24),
so every result, float or integer, is checked for exact equality.
"""
from __future__ import annotations

import os
import socket
import struct
import time

import numpy as np

import commlib
from commlib.core.call_spec import COLLECTIVE

COLLECTIVES = ("all_reduce", "reduce_scatter", "reduce", "all_gather", "all_to_all", "broadcast",
               "gather", "scatter", "barrier")
ROOTED = ("reduce", "broadcast", "gather", "scatter")
BIG = 70_001  # > one 512 KiB TCP chunk of float32 and several shm chunks; odd, so blocks are uneven


def _vals(rank, n, dtype, salt=0):
    return ((np.arange(n, dtype=np.int64) * 7 + rank * 3 + salt) % 11 + 1).astype(dtype)


def _one(comm, coll, algo, count, dtype, root):
    """Runs one call; returns None when right, else a description of what is wrong."""
    P, r = comm.size, comm.rank
    if coll == "barrier":
        comm.barrier()
        return None
    if coll in ("all_reduce", "reduce"):
        x = _vals(r, count, dtype)
        want = sum(_vals(q, count, np.int64) for q in range(P)).astype(dtype)
        if coll == "all_reduce":
            comm.all_reduce(x, algorithm=algo)
        else:
            comm.reduce(x, root=root, algorithm=algo)
            if r != root:
                return None
        got = x
    elif coll == "reduce_scatter":
        x = _vals(r, count * P, dtype)
        got = np.zeros(count, dtype)
        comm.reduce_scatter(got, x, algorithm=algo)
        want = sum(_vals(q, count * P, np.int64) for q in range(P))[r * count:(r + 1) * count].astype(dtype)
    elif coll == "all_gather":
        got = np.zeros(count * P, dtype)
        comm.all_gather(got, _vals(r, count, dtype), algorithm=algo)
        want = np.concatenate([_vals(q, count, dtype) for q in range(P)])
    elif coll == "all_to_all":
        got = np.zeros(count * P, dtype)
        comm.all_to_all(got, _vals(r, count * P, dtype), algorithm=algo)
        want = np.concatenate([_vals(q, count * P, dtype)[r * count:(r + 1) * count] for q in range(P)])
    elif coll == "broadcast":
        got = _vals(r, count, dtype)
        comm.broadcast(got, root=root, algorithm=algo)
        want = _vals(root, count, dtype)
    elif coll == "gather":
        got = np.zeros(count * P, dtype) if r == root else None
        comm.gather(got, _vals(r, count, dtype), root=root, algorithm=algo)
        if r != root:
            return None
        want = np.concatenate([_vals(q, count, dtype) for q in range(P)])
    else:  # scatter
        got = np.zeros(count, dtype)
        comm.scatter(got, _vals(r, count * P, dtype) if r == root else None, root=root, algorithm=algo)
        want = _vals(root, count * P, dtype)[r * count:(r + 1) * count]
    if not np.array_equal(got, want):
        bad = int(np.flatnonzero(got != want)[0])
        return f"element {bad}: got {got[bad]}, expected {want[bad]}"
    return None


def matrix(comm, full: bool):
    """Every collective x algorithm. ``full``: every count in (0, 1, P+1, BIG) x float32/int64 x
    two roots (the rooted collectives; the others take no root, so a second root ran the same calls
    again); otherwise a covering selection that still gives every algorithm a small and a
    large message, rotating dtype and root across algorithms."""
    P = comm.size
    failures = []
    for coll in COLLECTIVES:
        algos = commlib.algorithms(coll) + ["auto"]
        for i, algo in enumerate(algos):
            if full:
                roots = sorted({0, P - 1}) if coll in ROOTED else [0]
                combos = [(c, d, root) for c in (0, 1, P + 1, BIG) for d in (np.float32, np.int64) for root in roots]
            else:
                d = (np.float32, np.int64, np.int32)[i % 3]
                combos = [(3, d, i % P), (BIG, d, (i + 1) % P)]
            for count, dtype, root in combos:
                what = f"{coll} {algo} count={count} {np.dtype(dtype).name} root={root} rank={comm.rank}"
                try:
                    err = _one(comm, coll, algo, count, dtype, root)
                except Exception as e:  # noqa: BLE001 - report every case
                    err = f"raised {type(e).__name__}: {e}"
                if err:
                    failures.append(f"{what}: {err}")
                    if len(failures) > 10:
                        return failures
    return failures


def topology(comm):
    t = comm.topology
    return t.hosts, t.host_of, t.links


def p2p_ring(comm):
    """Each rank sends to the next and receives from the previous (crossing hosts)."""
    P, r = comm.size, comm.rank
    out = []
    for n in (0, 5, 300_000):
        got = np.zeros(n, np.int64)
        comm.sendrecv(np.full(n, r, np.int64), (r + 1) % P, got, (r - 1) % P)
        out.append(bool((got == (r - 1) % P).all()))
    return out


def tcp_port(comm):
    return comm._core.tcp_address()


def rejected(comm):
    return comm._core.tcp_rejected()


def still_works(comm):
    x = np.full(100_000, comm.rank + 1, np.int64)
    comm.all_reduce(x)
    return bool((x == comm.size * (comm.size + 1) // 2).all())


def _parse(addr):
    host, port = addr.rsplit(":", 1)
    return host.strip("[]"), int(port)


def fuzz_port(addr, seed, connections=60):
    """Throws random, truncated and almost-valid frames at a rank's listening port (run by the
    test process, not a rank). Returns how many connections it opened."""
    import random
    rng = random.Random(seed)
    host, port = _parse(addr)
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    magic = struct.pack("<Q", 0x31706374626c6d63)
    opened = 0
    for i in range(connections):
        kind = i % 6
        if kind == 0:
            payload = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 300)))
        elif kind == 1:  # a truncated hello
            payload = magic + bytes(rng.randrange(0, 40))
        elif kind == 2:  # a hello with impossible ranks / sizes
            payload = magic + struct.pack("<II", 1, 48) + bytes(16) + struct.pack(
                "<IIIiQ", rng.getrandbits(32), rng.getrandbits(32), rng.getrandbits(32), 1, rng.getrandbits(64)) + bytes(32)
        elif kind == 3:  # a data frame header straight away, claiming a huge body
            payload = struct.pack("<IHHQ", 0x6d6c6263, 1, 0, 1 << 62)
        elif kind == 4:  # nothing at all: connect and close
            payload = b""
        else:  # many bytes of a right-looking magic
            payload = magic * rng.randrange(1, 50)
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect((host, port))
            opened += 1
            try:
                s.sendall(payload)
                if kind == 5:  # wait briefly for the rank's verdict (it closes on bad magic)
                    s.settimeout(0.3)
                    s.recv(100)
            except OSError:
                pass
    return opened


def fds_and_threads():
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def split_cycles(comm, n=3):
    """Creates, uses (async, so the worker starts) and closes sub-communicators spanning hosts;
    returns (fds, threads) before and after."""
    before = fds_and_threads()
    for _ in range(n):
        sub = comm.split(0)
        works = [sub.all_reduce(np.ones(1000, np.float32), async_op=True) for _ in range(3)]
        for w in works:
            w.wait()
        sub.close()
    time.sleep(0.2)
    return before, fds_and_threads()


def auto_choices(comm):
    """What auto picks per collective (the same for 8 B and 16 MiB, which the test also checks)."""
    out = {}
    for c in ("all_reduce", "all_gather", "broadcast", "all_to_all"):
        small, large = comm._core.auto_choice(COLLECTIVE[c], 8), comm._core.auto_choice(COLLECTIVE[c], 16 << 20)
        out[c] = small if small == large or "hierarchical" not in (small, large) else f"{small}/{large}"
    return out
