"""Rank-side checks for TCP striping (several connections, "lanes", per pair of ranks on different
hosts): exact results at chunk counts that split unevenly over the lanes, a lane shut down in the
middle of a transfer, and descriptors after close.

Values are small integers, so every result (float32 too) is checked for exact equality.
"""
from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np

import commlib

DTYPES = (np.float32, np.int64, np.int8, np.float64)


def _vals(rank, n, dtype, salt=0):
    return ((np.arange(n, dtype=np.int64) * 5 + rank * 3 + salt) % 7 + 1).astype(dtype)


def sizes_in_chunks(lanes):
    """Chunk counts that split unevenly over `lanes`: 1, lanes - 1, lanes + 1, and primes."""
    return sorted({1, max(lanes - 1, 1), lanes + 1, 5, 7, 13})


def uneven_messages(comm, chunk_bytes, lanes):
    """Point-to-point (rank 0 <-> 1) and all_reduce in and out of place, for every chunk count in
    sizes_in_chunks(lanes) (the last chunk partial) and every dtype. Returns (failures, stats)."""
    fails = []
    P, r = comm.size, comm.rank
    for i, chunks in enumerate(sizes_in_chunks(lanes)):
        for j, dtype in enumerate(DTYPES):
            esize = np.dtype(dtype).itemsize
            # A partial last chunk (except for one-chunk messages, which also come whole).
            nbytes = chunks * chunk_bytes - (esize * (1 + i + j) if chunks > 1 or j % 2 else 0)
            n = nbytes // esize
            what = f"{chunks} chunks of {np.dtype(dtype).name} ({n} elements)"
            if r in (0, 1):  # both directions at once, so lanes carry traffic each way
                peer = 1 - r
                got = np.zeros(n, dtype)
                comm.sendrecv(_vals(r, n, dtype, i), peer, got, peer)
                if not np.array_equal(got, _vals(peer, n, dtype, i)):
                    fails.append(f"sendrecv {what}: wrong data")
            x = _vals(r, n, dtype, j)
            want = sum(_vals(q, n, np.int64, j) for q in range(P)).astype(dtype)
            out = np.zeros(n, dtype)
            comm.all_reduce(x, out=out, algorithm="ring")
            if not np.array_equal(out, want):
                fails.append(f"all_reduce out of place {what}: wrong sum")
            comm.all_reduce(x, algorithm="ring")
            if not np.array_equal(x, want):
                fails.append(f"all_reduce in place {what}: wrong sum")
    comm.barrier()
    return fails, comm._core.tcp_stats()


def _address_tuple(addr: str):
    host, port = addr.rsplit(":", 1)
    return host.strip("[]"), int(port)


def _lanes_to(address):
    """This process's connected sockets whose peer is `address` (a listening "host:port"), by fd."""
    want = _address_tuple(address)
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.getpeername()[:2] == want:
                found.append(fd)
        except OSError:
            pass
        finally:
            s.close()
    return sorted(found)


def lane_killed_mid_transfer(comm, killer, lane, timeout_s):
    """A sub-communicator (own TCP lanes) runs large all_reduces; rank `killer` shuts down its
    connection number `lane` to rank 0 (by descriptor order: lanes connect in order) in the middle.
    Every rank must raise PeerError within `timeout_s`. Returns (message, seconds after the kill)."""
    sub = comm.split(0, timeout=timeout_s)
    addr = sub._core.tcp_address().encode().ljust(64, b"\0")
    table = np.zeros(64 * sub.size, np.uint8)
    sub.all_gather(table, np.frombuffer(addr, np.uint8).copy())
    rank0 = bytes(table[:64]).rstrip(b"\0").decode()
    killed_at = [None]
    if sub.rank == killer:
        fds = _lanes_to(rank0)
        victim = fds[lane]

        def kill():
            time.sleep(0.3)
            s = socket.socket(fileno=os.dup(victim))
            s.shutdown(socket.SHUT_RDWR)  # the shared socket: both directions end, mid-frame
            s.close()
            killed_at[0] = time.monotonic()

        threading.Thread(target=kill, daemon=True).start()
    x = np.ones(4 << 20, np.float32)
    start = time.monotonic()
    try:
        for _ in range(200):
            sub.all_reduce(x, algorithm="ring")
        msg = None
    except commlib.PeerError as e:
        msg = f"PeerError: {e}"
    except commlib.CommError as e:
        msg = f"wrong type {type(e).__name__}: {e}"
    took = time.monotonic() - (killed_at[0] or start)
    sub.close()
    comm.barrier()  # the parent's links are untouched
    return msg, took


def lanes_after_close(comm, cycles=2):
    """Sub-communicators across hosts with several lanes, used and closed: returns (fds, threads)
    before and after, and how many frames went on lanes other than the first."""
    def counts():
        return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))

    before = counts()
    striped = 0
    for _ in range(cycles):
        sub = comm.split(0)
        x = np.ones(1 << 20, np.float32)  # 4 MiB: 8 chunks, so every lane carries some
        sub.all_reduce(x, algorithm="ring")
        striped += sub._core.tcp_stats()["frames_striped"]
        sub.close()
    time.sleep(0.2)
    return before, counts(), striped
