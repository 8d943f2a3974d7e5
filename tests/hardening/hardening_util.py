"""Helpers for the hardening tests: a live communicator's shared-memory region as raw bytes (to
play a malicious peer), ranks of one process started in threads, and a second local user."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
import uuid

import commlib._C as _C

LINE = 64
HEADER = LINE                 # RegionHeader, rounded to a cache line
CHUNK_HEADER = LINE           # ChunkHeader (48 bytes), rounded
CHANNEL_CTL = 3 * LINE        # tail, head, acked: a line each
# RegionHeader (shm_layout.h): magic, size, nslots at 12, slot_bytes at 16, stream_bytes at 24.
# RankCtl field offsets (csrc/transport/shm/shm_layout.h): doorbell, sleeping, pid (with state and
# error kind) and the published call (its seqlock version first) each on their own lines.
CTL_STATE, CTL_ERROR_KIND, CTL_CALL_VERSION, CTL_CALL, CTL_MESSAGE = 132, 136, 192, 200, 224


class Region:
    """The region of the communicator whose prefix is ``prefix``, as mapped in this process."""

    def __init__(self, prefix: str, size: int):
        name = f"/memfd:commlib:{prefix} (deleted)"
        with open("/proc/self/maps") as f:
            spans = [line.split()[0] for line in f if line.rstrip().endswith(name)]
        assert spans, f"no mapping of {name}"
        start = int(spans[-1].split("-")[0], 16)
        self.base, self.size = start, size
        self.total = _C.shm_region_bytes(size)
        self.nslots = ctypes.c_uint32.from_address(start + 12).value
        self.slot_bytes = ctypes.c_uint64.from_address(start + 16).value
        self.slot_stride = CHUNK_HEADER + -(-self.slot_bytes // LINE) * LINE
        self.stream_bytes = ctypes.c_uint64.from_address(start + 24).value
        self.channel_stride = CHANNEL_CTL + self.nslots * self.slot_stride
        # each rank's broadcast stream after the channels: its produced line, a consumed line per
        # rank, the ring (shm_transport.cc's stream_stride)
        self.stream_stride = (1 + size) * LINE + -(-self.stream_bytes // LINE) * LINE
        self.ctl_stride = (self.total - HEADER - size * size * self.channel_stride - size * self.stream_stride) // size
        self.chan_offset = HEADER + size * self.ctl_stride

    def ctl(self, rank: int) -> int:
        return self.base + HEADER + rank * self.ctl_stride

    def channel(self, src: int, dst: int) -> int:
        return self.base + self.chan_offset + (src * self.size + dst) * self.channel_stride

    def publish_chunk(self, src: int, dst: int, header: bytes, payload: bytes = b""):
        """Put a chunk with ``header`` (up to 64 bytes) in the src->dst channel, as src would."""
        ch = self.channel(src, dst)
        tail = ctypes.c_uint64.from_address(ch)
        slot = ch + CHANNEL_CTL + (tail.value % self.nslots) * self.slot_stride
        ctypes.memmove(slot, header, len(header))
        ctypes.memmove(slot + CHUNK_HEADER, payload, min(len(payload), self.slot_bytes))
        tail.value += 1

    def write(self, address: int, data: bytes):
        ctypes.memmove(address, data, len(data))


def run_ranks(fn, n: int, timeout: float = 30.0):
    """Run ``fn(rank)`` for ranks 0..n-1 in threads of this process; returns results or exceptions."""
    out = [None] * n

    def body(r):
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - returned for the test to inspect
            out[r] = e

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a rank hung"
    return out


class SecondUser:
    """A throw-away local user (root only, where useradd works); removed on exit."""

    def __init__(self):
        self.name = "cl" + uuid.uuid4().hex[:8]

    @staticmethod
    def available() -> bool:
        return os.geteuid() == 0 and shutil.which("useradd") is not None and shutil.which("userdel") is not None

    def __enter__(self):
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", self.name], check=True, capture_output=True)
        import pwd
        entry = pwd.getpwnam(self.name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        return self

    def __exit__(self, *exc):
        subprocess.run(["userdel", self.name], capture_output=True)

    def demote(self):
        """A preexec_fn that makes the child run as this user."""
        uid, gid = self.uid, self.gid

        def fn():
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        return fn
