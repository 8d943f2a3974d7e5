"""Row 8: output partly overlapping input (not the same buffer), 3 ranks.

Before: silently wrong results (all_reduce ring/rabenseifner, all_gather ring/direct). Now a partial
overlap raises ValueError naming the arguments before anything is sent, on the fast path and the
general path alike; the exact in-place layouts keep working.
"""
import numpy as np
import pytest

import commlib


def overlap_cases(comm):
    P, r, n = comm.size, comm.rank, 6
    out = {}

    def refused(name, fn):
        try:
            fn()
            out[name] = "ran"
        except ValueError as e:
            out[name] = str(e)

    a = np.arange(2 * n, dtype=np.float32)
    refused("all_reduce", lambda: comm.all_reduce(a[:n], out=a[2:2 + n], algorithm="ring"))
    refused("all_reduce-torch-like", lambda: comm.all_reduce(a[:n], out=a[1:1 + n], algorithm="rabenseifner"))
    g = np.zeros(P * n + 1, np.float32)
    refused("all_gather", lambda: comm.all_gather(g[:P * n], g[1:1 + n], algorithm="ring"))
    refused("reduce_scatter", lambda: comm.reduce_scatter(g[1:1 + n], g[:P * n]))
    t = np.zeros(P * n + 2, np.float32)
    refused("all_to_all", lambda: comm.all_to_all(t[:P * n], t[2:2 + P * n]))
    refused("reduce", lambda: comm.reduce(a[:n], out=a[3:3 + n], root=0))
    # The very same start address where that is in place only on rank 0 (the call's early return for
    # in-place calls must not take it): refused on every other rank; rank 0 passes block 1, refused too.
    first = g[n:2 * n] if r == 0 else g[:n]
    refused("all_gather-same-start", lambda: comm.all_gather(g[:P * n], first))
    refused("reduce_scatter-same-start", lambda: comm.reduce_scatter(first, g[:P * n]))
    # Exact in-place layouts still work.
    x = np.full(n, r + 1, np.float32)
    comm.all_reduce(x, out=x, algorithm="ring")
    out["in-place all_reduce"] = x.tolist() == [P * (P + 1) / 2] * n
    buf = np.zeros(P * n, np.float32)
    buf[r * n:(r + 1) * n] = r
    comm.all_gather(buf, buf[r * n:(r + 1) * n], algorithm="direct")
    out["in-place all_gather"] = buf.tolist() == np.repeat(np.arange(P, dtype=np.float32), n).tolist()
    return out


def test_partial_overlap_raises_and_in_place_works(pool):
    for res in pool(3).run(overlap_cases, timeout=30):
        for name in ("all_reduce", "all_reduce-torch-like", "reduce"):
            assert res[name].startswith("out: partly overlaps tensor"), (name, res[name])
        for name in ("all_gather", "reduce_scatter", "all_to_all", "all_gather-same-start",
                     "reduce_scatter-same-start"):
            assert res[name].startswith("output: partly overlaps input"), (name, res[name])
        assert res["in-place all_reduce"] and res["in-place all_gather"], res


def test_all_to_allv_overlap_is_refused():
    from commlib.bootstrap.store import StoreServer, TCPStore
    server = StoreServer()
    comm = commlib.init(rank=0, world_size=1, store=TCPStore("127.0.0.1", server.port), prefix="a2av")
    try:
        t = np.zeros(8, np.float32)
        with pytest.raises(ValueError, match="output: overlaps input"):
            comm.all_to_all(t[:4], t[2:6], input_splits=[4], output_splits=[4])
    finally:
        comm.close()
        server.close()
