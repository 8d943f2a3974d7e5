"""The bench's host buffers: large ones fresh anonymous mappings, whatever the process freed before
(why: ``fresh_empty``). Shared by every backend's rank process through ``commlib.perf.common.empty``."""
from __future__ import annotations

# From this size glibc's malloc maps a fresh block (its default mmap threshold, before the dynamic
# raise below), and where a mapped block's data starts: past glibc's 16-byte chunk header.
MMAP_THRESHOLD = 128 << 10
MAPPED_DATA_OFFSET = 16
# From this size NumPy asks the kernel for transparent huge pages on its arrays' data (madvise
# MADV_HUGEPAGE); where the kernel gives them only on request (transparent_hugepage "madvise"), a
# buffer without the request is all 4 KiB pages and every single-copy read of it pins page by page.
NUMPY_HUGEPAGE_BYTES = 4 << 20


def fresh_empty(count: int, dtype):
    """An uninitialised NumPy array of ``count`` elements: from 128 KiB a fresh anonymous mapping laid
    out as glibc lays out a mapped block (data 16 bytes past the mapping's start), below that
    ``np.empty``. The bench's buffers come from here, so every backend's buffers depend only on the
    sizes asked, not on what its process allocated and freed before: glibc raises its mmap threshold
    each time a mapped block is freed (up to 32 MiB), and a process that freed large buffers then gets
    later ones from heap memory it touched before, on 4 KiB pages (in the main job commlib's rank, which
    allocates both modes' buffers, read 16 MiB all_to_all buffers 75% on huge pages where Open MPI's
    read 87.5%, a fresh mapping's share). Only the bench's own buffers: fixing the process's threshold
    instead (``mallopt``, session 22's first try) also made every per-call temporary that Open MPI and
    gloo allocate a fresh mapping, faulted in on every call, which slowed their 16 MiB all_reduce by
    1.5-2x in the main job: a handicap no user of those libraries has."""
    import mmap
    import numpy as np
    dt = np.dtype(dtype)
    nbytes = int(count) * dt.itemsize
    if nbytes < MMAP_THRESHOLD:
        return np.empty(count, dt)
    m = mmap.mmap(-1, nbytes + MAPPED_DATA_OFFSET, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if nbytes >= NUMPY_HUGEPAGE_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)  # as NumPy asks for its own data (transparent huge pages on madvise)
    return np.frombuffer(m, dt, count, MAPPED_DATA_OFFSET)  # the array keeps the mapping alive
