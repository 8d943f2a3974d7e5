"""The symmetric pool (issue #38, item 1): device memory that commlib hands out at the same place on
every rank of a communicator, so that a peer's block is at the same offset of the peer's arena as
this rank's. One pool per (communicator, device), the same code for the emulated device and CUDA:
only the array type returned differs (``commlib.emulated.Array``, or a
:class:`commlib.device.cuda_array.CudaArray` that torch and CuPy take without a copy).

Arenas (16 MiB at least, first fit, 256-byte grain) are ``Device::allocate``'s memory: cudaMalloc
on CUDA, whose IPC handle (cudaIpcGetMemHandle) every peer on the host can open. Not cuMemCreate
with a POSIX-fd handle: that handle is a file descriptor, which would have to be passed between
the processes (a Unix socket or pidfd_getfd) and mapped with cuMemMap/cuMemSetAccess per peer, a
second import path beside the one the kernel path's registry already runs (cudaIpc, which ran on
the H200), for nothing the pool needs: its arenas are large and long-lived, so cudaMalloc's
granularity and the per-allocation handle cost nothing here.

When a pool allocates an arena, every rank registers it in its engine's registry of peers' buffers
(csrc/device/peer_buffers.h, ``share_arena``: its IPC handle in the rank's segment table), the
ranks exchange (buffer id, slot) through the communicator (one host all_gather), and every rank
maps every peer's arena there, once (``map_arena``). A call on any block of the arena then finds
its peers' blocks at the same offset without waiting (``arena_hits``). The registry is the one
mapping of the process: CUDA opens an IPC handle once per process, so the pool has no mapping of
its own.

``empty`` is collective, like torch's symmetric-memory allocation: every rank of ``comm`` calls it
with the same shape and dtype in the same order. Blocks are released when their array is
collected on a rank, and return to the pool once EVERY rank released them, agreed at the next
``empty`` (one host all_gather of a byte per live block), so the pool's state stays the same on
every rank. An arena whose blocks all returned is unmapped on every rank at that agreement and
freed at the next one (by then every peer has unmapped it). A released block is reused in the
order of the calls on the rank's streams, as torch's caching allocator does: work on another
stream must finish (or be waited for) before the array goes. When the communicator closes, its
engines close every mapping; arenas with no live block are freed then (after every rank said it
closed its imports), the others when their last array goes."""
from __future__ import annotations

from typing import Optional

import numpy as np

from commlib.device import dtypes

ARENA_BYTES = 16 << 20  # at least; an arena holds blocks of 256-byte granularity
GRAIN = 256
# How each device frees an arena: cudaFree (free_async: after the device's work) for cudaMalloc'd
# memory; the emulated device's stream-ordered free, as its own arrays are freed.
_FREE = {"cuda": "free_async", "emulated": "free_ordered"}


class _Block:
    """One block of a pool: what an array's ``_alloc`` holds (its ``ptr``)."""

    __slots__ = ("pool", "key", "ptr", "__weakref__")

    def __init__(self, pool, key, ptr):
        self.pool, self.key, self.ptr = pool, key, ptr

    def __del__(self):
        try:
            self.pool._released_block(self.key)
        except Exception:  # interpreter shutdown
            pass


class SymmetricPool:
    """The pool of one communicator on one device. ``device``: the ``_C.Device``; ``engine``: the
    communicator's stream engine of that device (its registry maps the arenas), ``stream_of``: the
    route's resolver of the current stream (frees are ordered on it)."""

    def __init__(self, kind: str, device_index: int, device, engine, stream_of):
        self.kind, self.device_index = kind, device_index
        self._device, self._engine, self._stream_of = device, engine, stream_of
        self._arenas = []   # index -> (base address, bytes), None once freed
        self._free = []     # (arena, offset, bytes), the same list on every rank
        self._live = {}     # (arena, offset) -> bytes
        self._released = set()
        self._unmapped = []  # arenas unmapped at the last agreement: freed at the next
        self._closed = False

    def _registry(self):
        e = self._engine
        return e if e is not None and e.has_kernel_path() else None

    def _released_block(self, key):
        self._released.add(key)
        if self._closed:  # no agreement any more: a block gone after close may free its arena
            self._free_idle_arenas()

    def _agree_on_releases(self, comm):
        keys = sorted(self._live)
        # The last byte makes the all_gather run even with no live block: it is also the barrier
        # after which the arenas unmapped at the last agreement are unmapped on every rank.
        mine = np.array([1 if k in self._released else 0 for k in keys] + [1], np.int8)
        every = np.zeros(len(mine) * comm.size, np.int8)
        comm.all_gather(every, mine)
        for a in self._unmapped:
            self._free_arena(a)
        self._unmapped = []
        everyone = every.reshape(comm.size, len(mine)).min(axis=0)
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
        self._free = []
        for a, off, n in merged:  # an arena wholly free: unmapped now on every rank, freed next time
            if off == 0 and n == self._arenas[a][1]:
                if self._registry() is not None:
                    self._registry().symmetric_unmap(self._arenas[a][0])
                self._unmapped.append(a)
            else:
                self._free.append((a, off, n))

    def _free_arena(self, a):
        base = self._arenas[a][0]
        self._arenas[a] = None
        getattr(self._device, _FREE[self.kind])(base, self._stream_of(None))

    def _new_arena(self, comm, size):
        base = self._device.allocate(size)
        self._arenas.append((base, size))
        registry = self._registry()
        share = registry.symmetric_share(base, size) if registry is not None else (0, 0)
        every = np.zeros(2 * comm.size, np.int64)
        comm.all_gather(every, np.array(share, np.int64))  # every rank's (buffer id, slot)
        if registry is not None:
            registry.symmetric_map(base, size, [(int(i), int(s)) for i, s in every.reshape(comm.size, 2)])
        return len(self._arenas) - 1

    def allocate(self, comm, nbytes: int) -> _Block:
        """A block of at least ``nbytes`` at the same (arena, offset) on every rank. Collective."""
        if self._closed:
            raise ValueError("comm: the communicator of this pool is closed")
        self._agree_on_releases(comm)
        need = max(GRAIN, -(-nbytes // GRAIN) * GRAIN)
        for i, (a, off, n) in enumerate(self._free):  # first fit: the same choice on every rank
            if n >= need:
                self._free[i:i + 1] = [(a, off + need, n - need)] if n > need else []
                break
        else:
            size = max(ARENA_BYTES, need)
            a, off = self._new_arena(comm, size), 0
            if size > need:
                self._free.append((a, need, size - need))
        self._live[(a, off)] = need
        return _Block(self, (a, off), self._arenas[a][0] + off)

    def empty(self, comm, dims: tuple, dtype: str):
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        block = self.allocate(comm, count * dtypes.SIZE[dtype])
        if self.kind == "cuda":
            from commlib.device.cuda_array import CudaArray
            return CudaArray(block, self.device_index, dims, dtype)
        from commlib.device import emulated
        return emulated.Array(block, self.device_index, 0, count, dtype)  # emulated arrays are 1-D

    def offset_of(self, array) -> tuple:
        """(arena, offset) of a pool array's first element: the same on every rank."""
        key = array._alloc.key
        return key[0], key[1] + getattr(array, "offset", 0)

    def arenas(self) -> int:
        """Arenas allocated now."""
        return sum(a is not None for a in self._arenas)

    def _free_idle_arenas(self):
        busy = {key[0] for key in self._live if key not in self._released}
        for a, arena in enumerate(self._arenas):
            if arena is not None and a not in busy:
                self._free_arena(a)

    def close(self, peers_closed: bool):
        """The communicator closed (its engines closed every mapping). ``peers_closed``: every
        rank said it closed its imports, so arenas without a live array are freed now and the
        others when their last array goes; otherwise nothing is freed (a peer may still map them,
        as with the engines' exported memory)."""
        self._closed = True
        self._engine = None
        if peers_closed:
            self._free_idle_arenas()
        else:
            self._arenas = [None] * len(self._arenas)


def empty(shape, dtype: str = "float32", comm=None, device=None):
    """An uninitialised array of ``shape`` from ``comm``'s symmetric pool on ``device`` ("cuda",
    "cuda:N", "emulated", "emulated:N", a torch.device; default: CUDA where commlib._C_cuda finds a
    device, else the emulated device ``commlib.emulated.current_device()``). Collective: every rank
    of ``comm`` calls it with the same shape, dtype and device, in the same order."""
    if comm is None or not hasattr(comm, "_symmetric_pool"):
        raise TypeError("comm: the communicator whose ranks share the pool is required")
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if any(not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
        raise ValueError(f"shape: expected non-negative integers, got {shape!r}")
    if dtype not in dtypes.SIZE:
        raise TypeError(f"dtype: unsupported {dtype!r} (supported: {', '.join(dtypes.NAMES)})")
    return comm._symmetric_pool(_default_device() if device is None else device).empty(comm, dims, dtype)


def _default_device() -> str:
    try:
        import commlib._C_cuda  # noqa: F401  (ImportError where no CUDA device is usable)
        return "cuda"
    except ImportError:
        from commlib.device import emulated
        return f"emulated:{emulated.current_device()}"


def pool_of(comm, device=None) -> Optional[SymmetricPool]:
    """``comm``'s pool on ``device`` (as ``empty``'s), made (collectively) on first use."""
    return comm._symmetric_pool(_default_device() if device is None else device)
