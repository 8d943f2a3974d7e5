"""What the explorer must show, computed here from the library's own answers (``_C.schedule``,
``_C.verify_trace``): the tests compare the page's data and the page's DOM against these."""
import commlib._C as _C
from commlib.core.call_spec import COLLECTIVE


def schedules(collective, algorithm, P, count, hosts, root=0):
    """Every rank's schedule as the page stores it (JSON: tuples become lists)."""
    out = []
    for r in range(P):
        s = _C.schedule(COLLECTIVE[collective], algorithm, r, P, count, root=root, hosts=hosts)
        out.append({"steps": [[{k: list(v) if isinstance(v, tuple) else v for k, v in op.items()} for op in st]
                              for st in s["steps"]], "scratch_count": s["scratch_count"]})
    return out


def holdings(collective, algorithm, P, count, hosts, root=0):
    """The verifier's holdings as the page stores them."""
    h = _C.verify_trace(COLLECTIVE[collective], algorithm, P, count, root=root, hosts=hosts)["holdings"]
    return [[[None if b is None else [[s, n, src, list(rs)] for s, n, src, rs in b] for b in bufs]
             for bufs in per] for per in h]


def per_element(runs):
    """[(src, ranks)] of every element of a buffer's runs (src < 0: no value)."""
    out = []
    for start, n, src, ranks in runs:
        out.extend((src + i if src >= 0 else src, tuple(ranks) if src >= 0 else ()) for i in range(n))
    return out


def messages(scheds, k):
    """{(src, dst, sent region, received region, receive op)} of step k (the sender's), receives
    matched to sends first in, first out per ordered pair."""
    recvs = {}
    for r, s in enumerate(scheds):
        for st, ops in enumerate(s["steps"]):
            for o in ops:
                if o["op"] in ("recv", "recv_reduce"):
                    recvs.setdefault((o["peer"], r), []).append(o)
    out, seen = set(), {}
    for r, s in enumerate(scheds):
        for st, ops in enumerate(s["steps"]):
            for o in ops:
                if o["op"] != "send":
                    continue
                i = seen.get((r, o["peer"]), 0)
                seen[(r, o["peer"])] = i + 1
                if st == k:
                    rcv = recvs[(r, o["peer"])][i]
                    out.add((r, o["peer"], region(o["src"]), region(rcv["dst"]), rcv["op"]))
    return out


def region(g):
    return f"{g[0]}[{g[1]}:{g[1] + g[2]}]"
