"""An independent cross-check of the symbolic verifier: a tiny NumPy interpreter runs every rank's
schedule on real float64 data (rendezvous matching, as in the verifier; one-sided ops read and write
the peers' arrays, a step starting once its waits have signals) and compares against NumPy
references; for all_reduce the ranks must also agree bitwise (same reduction order)."""
from collections import Counter

import numpy as np
import pytest

from commlib.core import schedules

from test_verify_all import CASES, ROOTED


def layout(coll, P, r, root, n, scratch, in_place):
    """Return (arena size, {buf: (base, size) or None})."""
    Pn = P * n
    sizes = {"all_reduce": (n, n), "all_gather": (n, Pn), "reduce_scatter": (Pn, n),
             "all_to_all": (Pn, Pn), "broadcast": (n, n), "reduce": (n, n), "gather": (n, Pn),
             "scatter": (Pn, n), "barrier": (0, 0)}[coll]
    ins, outs = sizes
    if coll in ("broadcast", "scatter") and r != root:
        ins = None
    if coll in ("reduce", "gather") and r != root:
        outs = None
    alias_in = alias_out = None
    if in_place:
        if coll == "all_reduce" or (coll in ("broadcast", "reduce") and r == root):
            alias_in = 0
        elif coll == "all_gather":
            alias_in = r * n
        elif coll == "gather" and r == root:
            alias_in = root * n
        elif coll == "reduce_scatter":
            alias_out = r * n
        elif coll == "scatter" and r == root:
            alias_out = root * n
    bufs = {}
    if alias_in is not None:
        bufs["output"], bufs["input"] = (0, outs), (alias_in, ins)
        pos = outs
    elif alias_out is not None:
        bufs["input"], bufs["output"] = (0, ins), (alias_out, outs)
        pos = ins
    else:
        bufs["output"] = (0, outs) if outs is not None else None
        pos = outs or 0
        bufs["input"] = (pos, ins) if ins is not None else None
        pos += ins or 0
    bufs["scratch"] = (pos, scratch)
    return pos + scratch, bufs


def run(coll, algo, P, n, root, in_place, inputs):
    sch = [schedules.schedule(coll, algo, r, P, n, root) for r in range(P)]
    mems, views = [], []
    for r in range(P):
        total, bufs = layout(coll, P, r, root, n, sch[r]["scratch_count"], in_place)
        mem = np.full(total, np.nan)
        v = {k: (mem[b[0]:b[0] + b[1]] if b is not None else None) for k, b in bufs.items()}
        if v["input"] is not None:
            v["input"][:] = inputs[r]
        mems.append(mem)
        views.append(v)

    def reg(r, region):
        buf, off, cnt = region
        return views[r][buf][off:off + cnt]

    step = [0] * P
    done = [set() for _ in range(P)]  # matched op indices of the current step
    signals = Counter()  # (from, to, tag): signals posted minus consumed
    progress = True
    while progress:
        progress = False
        for r in range(P):
            while step[r] < len(sch[r]["steps"]):
                ops = sch[r]["steps"][step[r]]
                waits = Counter((o["peer"], r, o["tag"]) for o in ops if o["op"] == "wait")
                if any(signals[k] < need for k, need in waits.items()):
                    break
                signals.subtract(waits)
                for i, o in enumerate(ops):
                    if o["op"] != "send" or i in done[r]:
                        continue
                    q = o["peer"]
                    if step[q] >= len(sch[q]["steps"]):
                        continue
                    for j, p in enumerate(sch[q]["steps"][step[q]]):
                        if p["op"] in ("recv", "recv_reduce") and p["peer"] == r and j not in done[q]:
                            data = reg(r, o["src"]).copy()
                            dst = reg(q, p["dst"])
                            if p["op"] == "recv":
                                dst[:] = data
                            elif p.get("src"):  # recv_reduce(peer, dst, src): dst = src + incoming
                                dst[:] = reg(q, p["src"]) + data
                            else:
                                dst += data
                            done[r].add(i)
                            done[q].add(j)
                            progress = True
                            break
                comm = [i for i, o in enumerate(ops) if o["op"] in ("send", "recv", "recv_reduce")]
                if not all(i in done[r] for i in comm):
                    break
                for o in ops:
                    if o["op"] == "copy":
                        reg(r, o["dst"])[:] = reg(r, o["src"]).copy()
                    elif o["op"] == "reduce":
                        reg(r, o["dst"])[:] += reg(r, o["src"])
                    elif o["op"] == "get":
                        reg(r, o["dst"])[:] = reg(o["peer"], o["src"]).copy()
                    elif o["op"] == "get_reduce":
                        reg(r, o["dst"])[:] += reg(o["peer"], o["src"])
                    elif o["op"] == "put":
                        reg(o["peer"], o["dst"])[:] = reg(r, o["src"]).copy()
                    elif o["op"] == "reduce_to_all":  # every rank's src summed in rank order, into every rank's dst
                        total = reg(0, o["src"]).copy()
                        for q in range(1, P):
                            total += reg(q, o["src"])
                        for q in range(P):
                            reg(q, o["dst"])[:] = total
                    elif o["op"] == "reduce_from_all":  # the same into this rank's dst only
                        total = reg(0, o["src"]).copy()
                        for q in range(1, P):
                            total += reg(q, o["src"])
                        reg(r, o["dst"])[:] = total
                signals.update((r, o["peer"], o["tag"]) for o in ops if o["op"] == "signal")
                step[r] += 1
                done[r] = set()
                progress = True
    assert all(step[r] == len(sch[r]["steps"]) for r in range(P)), "deadlock"
    return [views[r]["output"] for r in range(P)]


def reference(coll, P, n, root, inputs, r):
    X = inputs
    if coll == "all_reduce":
        return sum(X)
    if coll == "reduce":
        return sum(X) if r == root else None
    if coll == "all_gather":
        return np.concatenate(X) if P else None
    if coll == "gather":
        return np.concatenate(X) if r == root else None
    if coll == "reduce_scatter":
        return sum(X)[r * n:(r + 1) * n]
    if coll == "all_to_all":
        return np.concatenate([X[j][r * n:(r + 1) * n] for j in range(P)])
    if coll == "broadcast":
        return X[root]
    if coll == "scatter":
        return X[root][r * n:(r + 1) * n]


def input_len(coll, P, n):
    return P * n if coll in ("reduce_scatter", "all_to_all", "scatter") else n


@pytest.mark.parametrize("collective,algorithm", [c for c in CASES if c[0] != "barrier"],
                         ids=[f"{c}-{a}" for c, a in CASES if c != "barrier"])
def test_numeric(collective, algorithm):
    rng = np.random.default_rng(0)
    for P in (1, 2, 3, 4, 5, 6, 7, 8, 11, 16):
        for n in sorted({0, 1, max(P - 1, 0), 13, 40}):
            roots = sorted({0, P - 1, P // 2}) if collective in ROOTED else [0]
            for root in roots:
                inputs = [rng.standard_normal(input_len(collective, P, n)) for _ in range(P)]
                modes = [False] if collective == "all_to_all" else [False, True]
                for ip in modes:
                    outs = run(collective, algorithm, P, n, root, ip, inputs)
                    for r in range(P):
                        ref = reference(collective, P, n, root, inputs, r)
                        if ref is None:
                            assert outs[r] is None
                            continue
                        np.testing.assert_allclose(outs[r], ref, rtol=1e-12, atol=1e-12,
                                                   err_msg=f"P={P} n={n} root={root} in_place={ip} rank {r}")
                    if collective == "all_reduce":
                        for r in range(1, P):
                            assert outs[r].tobytes() == outs[0].tobytes(), f"P={P} n={n} rank {r} differs bitwise"
