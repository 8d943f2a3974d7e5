"""A symmetric pool (issue #38, item 1): device memory that commlib hands out at the same place on
every rank of a communicator, so that a peer's block is at the same offset of the peer's arena as
this rank's. The arenas are ordinary shareable allocations (``cudaMalloc``-style), so the kernel
path's registry of peers' buffers (csrc/device/peer_buffers.h) maps each arena once and every block
after it is a hit whose prediction is right: what serves as the buffer of memory that cannot be
mapped (a VMM allocation without a shareable handle, a CuPy-style pool).

``empty`` is collective, like torch's symmetric-memory allocation: every rank of ``comm`` calls it
with the same shape and dtype in the same order. Blocks are released when their array is
collected on a rank, and return to the pool once EVERY rank released them, agreed at the next
``empty`` (one host all_gather of a byte per live block), so the pool's state stays the same on
every rank. A released block is reused in the order of the calls on the rank's streams, as torch's
caching allocator does: work on another stream must finish (or be waited for) before the array
goes. The emulated device only so far (docs/gpu.md "Peers' buffers, mapped")."""
from __future__ import annotations

import weakref
from typing import Optional

import numpy as np

from commlib.device import dtypes, emulated

ARENA_BYTES = 16 << 20  # at least; an arena holds blocks of 256-byte granularity
GRAIN = 256
_pools: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _Block:
    """One block of a pool: what an emulated Array's ``_alloc`` holds (its ``ptr``)."""

    __slots__ = ("pool", "key", "ptr", "__weakref__")

    def __init__(self, pool, key, ptr):
        self.pool, self.key, self.ptr = pool, key, ptr

    def __del__(self):
        try:
            self.pool._released.add(self.key)
        except Exception:  # interpreter shutdown
            pass


class SymmetricPool:
    """The pool of one communicator on one emulated device."""

    def __init__(self, comm, device_index: int):
        self._comm, self._device_index = comm, device_index
        self._arenas = []   # (base address, bytes)
        self._free = []     # (arena, offset, bytes), the same list on every rank
        self._live = {}     # (arena, offset) -> bytes
        self._released = set()

    def _agree_on_releases(self):
        keys = sorted(self._live)
        if not keys:
            return
        mine = np.array([1 if k in self._released else 0 for k in keys], np.int8)
        every = np.zeros(len(keys) * self._comm.size, np.int8)
        self._comm.all_gather(every, mine)
        everyone = every.reshape(self._comm.size, len(keys)).min(axis=0)
        for k, gone in zip(keys, everyone):
            if gone:
                self._free.append((k[0], k[1], self._live.pop(k)))
                self._released.discard(k)
        self._free.sort()
        merged = []  # adjacent free ranges of one arena coalesced
        for a, off, n in self._free:
            if merged and merged[-1][0] == a and merged[-1][1] + merged[-1][2] == off:
                merged[-1] = (a, merged[-1][1], merged[-1][2] + n)
            else:
                merged.append((a, off, n))
        self._free = merged

    def allocate(self, nbytes: int) -> _Block:
        self._agree_on_releases()
        need = max(GRAIN, -(-nbytes // GRAIN) * GRAIN)
        for i, (a, off, n) in enumerate(self._free):  # first fit: the same choice on every rank
            if n >= need:
                self._free[i:i + 1] = [(a, off + need, n - need)] if n > need else []
                break
        else:
            size = max(ARENA_BYTES, need)
            base = emulated.device(self._device_index).allocate(size)
            self._arenas.append((base, size))
            a, off = len(self._arenas) - 1, 0
            if size > need:
                self._free.append((a, need, size - need))
        self._live[(a, off)] = need
        return _Block(self, (a, off), self._arenas[a][0] + off)

    def offset_of(self, array) -> tuple:
        """(arena, offset) of a pool array's first element: the same on every rank."""
        key = array._alloc.key
        return key[0], key[1] + array.offset


def pool_of(comm, device_index: Optional[int] = None) -> SymmetricPool:
    index = emulated.current_device() if device_index is None else device_index
    per_comm = _pools.setdefault(comm, {})
    if index not in per_comm:
        per_comm[index] = SymmetricPool(comm, index)
    return per_comm[index]


def empty(shape, dtype: str = "float32", comm=None, device_index: Optional[int] = None):
    """An uninitialised emulated array of ``shape`` (its elements, flattened: emulated arrays are
    one-dimensional) from ``comm``'s symmetric pool on ``device_index`` (default: the current
    device). Collective: every rank of ``comm`` calls it with the same shape and dtype."""
    if comm is None or not hasattr(comm, "all_gather"):
        raise TypeError("comm: the communicator whose ranks share the pool is required")
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        raise ValueError(f"shape: expected non-negative integers, got {shape!r}")
    if dtype not in dtypes.SIZE:
        raise TypeError(f"dtype: unsupported {dtype!r} (supported: {', '.join(dtypes.NAMES)})")
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    pool = pool_of(comm, device_index)
    block = pool.allocate(count * dtypes.SIZE[dtype])
    return emulated.Array(block, pool._device_index, 0, count, dtype)
