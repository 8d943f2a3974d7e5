"""Rank-side cases of test_chunk_stores.py: messages of many chunks through the channels, values
changing every call, so each peer's chunk fills are measured with plain and non-temporal stores
(csrc/host/chunk_stores.cc: plain at a peer's first message, non-temporal for one chunk of its
second, then the better kind, the other probed every 16 messages)."""
from __future__ import annotations

import numpy as np


def many_chunk_messages(comm, calls=40):
    """A binomial broadcast from each root in turn and a ring all_gather, of about 300 KiB a
    message (several 64 KiB chunks and a partial one): every rank must hold exactly this call's
    values. Returns the failures."""
    P, r = comm.size, comm.rank
    n = (4 * 65536 + 4100) // 4 + 3
    failures = []
    x = np.empty(n, np.float32)
    out = np.empty(P * n, np.float32)
    base = np.arange(n, dtype=np.float32)
    for k in range(calls):
        root = (k // 8) % P
        want = base + 7 * k + root
        x[:] = want if r == root else -1
        comm.broadcast(x, root=root, algorithm="binomial")
        if not np.array_equal(x, want):
            failures.append(f"broadcast {k} (root {root}) on rank {r}: wrong at {int(np.argmax(x != want))}")
        mine = base + 11 * k + 1000 * r
        out[:] = -1
        comm.all_gather(out, mine, algorithm="ring")
        want_all = np.concatenate([base + 11 * k + 1000 * q for q in range(P)])
        if not np.array_equal(out, want_all):
            failures.append(f"all_gather {k} on rank {r}: wrong at {int(np.argmax(out != want_all))}")
    return failures
