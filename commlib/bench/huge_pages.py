"""How much of a host buffer sits on 2 MiB (transparent huge) pages.

A single-copy read of a peer's buffer (process_vm_readv) pins the peer's pages one 4 KiB page at a
time unless they are huge pages, which it takes whole; the same 4 MiB block costs its reader about a
fifth more CPU on 4 KiB pages (bench/RESULTS_collectives.md, session 22). NumPy marks buffers of
4 MiB or more MADV_HUGEPAGE, but they start 16 bytes past a 4 KiB page, so only their 2 MiB-aligned
interior can be huge, and where the allocator reuses memory touched before, none of it: the share
depends on the process's history. The bench records it per row (``huge_pages``) so that rows of
two runs, or of commlib and a peer, can be compared on the pages they read.
"""
from __future__ import annotations

HUGE = 2 << 20


def _flags_reader():
    """(pagemap, kpageflags) files, or None where a page's frame cannot be read (not root)."""
    try:
        pm, kf = open("/proc/self/pagemap", "rb"), open("/proc/kpageflags", "rb")
    except OSError:
        return None
    return pm, kf


def huge_share(address: int, nbytes: int):
    """The share of ``[address, address + nbytes)`` on huge pages, exact: one page of every 2 MiB
    frame the range touches looked up in /proc/self/pagemap and /proc/kpageflags (KPF_THP; a huge
    page is its whole aligned 2 MiB or nothing), each frame weighted by the bytes of the range in
    it; a page not yet touched counts as not huge. 0 for an empty range; None where the frames
    cannot be read (needs root: kpageflags, and pagemap's frame numbers)."""
    if nbytes <= 0:
        return 0.0
    files = _flags_reader()
    if files is None:
        return None
    pm, kf = files
    huge = 0
    with pm, kf:
        start = address
        while start < address + nbytes:
            end = min((start // HUGE + 1) * HUGE, address + nbytes)
            pm.seek(start // 4096 * 8)
            entry = int.from_bytes(pm.read(8), "little")
            frame = entry & ((1 << 55) - 1)
            if entry >> 63 and frame:  # present, and its frame readable
                kf.seek(frame * 8)
                if int.from_bytes(kf.read(8), "little") >> 22 & 1:  # KPF_THP
                    huge += end - start
            start = end
    return huge / nbytes


def buffer_share(buf):
    """huge_share of a NumPy buffer; None for anything else (torch, device buffers), for one below
    2 MiB (no huge page fits) and where the frames cannot be read."""
    import numpy as np
    if not isinstance(buf, np.ndarray) or buf.nbytes < HUGE:
        return None
    return huge_share(buf.ctypes.data, buf.nbytes)
