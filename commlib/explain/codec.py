"""The page's compact form of a case (a page of P up to 16 stays a few MB and opens in well under a
second): an op is 9 integers (kind, peer, dst, src, tag), a buffer's runs one flat list with contributor sets as bit masks, and a
buffer unchanged since the rank's previous step is 0. model.js's decodeCase reads it back in the
browser; :func:`decode_case` here (tests, ``embedded_data``) is its Python twin."""
from __future__ import annotations

__all__ = ["OPS", "BUFFERS", "encode_case", "decode_case"]

OPS = ("send", "recv", "recv_reduce", "copy", "reduce", "get", "get_reduce", "put", "signal", "wait", "reduce_to_all",
       "reduce_from_all")
SYNC = ("signal", "wait")  # the ops with a tag (ir.h)
BUFFERS = ("input", "output", "scratch")
UNCHANGED = 0


def _region(g):
    return [-1, 0, 0] if g is None else [BUFFERS.index(g[0]), g[1], g[2]]


def _unregion(b, off, n):
    return None if b < 0 else [BUFFERS[b], off, n]


def _op_code(name):
    """An op's number, or its name where the IR has kinds this table does not list."""
    return OPS.index(name) if name in OPS else name


def _decode_op(o):
    name = o[0] if isinstance(o[0], str) else OPS[o[0]]
    op = {"op": name, "peer": None if o[1] < 0 else o[1], "dst": _unregion(*o[2:5]), "src": _unregion(*o[5:8])}
    if name in SYNC:
        op["tag"] = o[8]
    return op


def _mask(ranks):
    m = 0
    for r in ranks:
        m |= 1 << r
    return m


def _ranks(mask):
    return [r for r in range(mask.bit_length()) if mask >> r & 1]


def encode_case(c: dict) -> dict:
    """A case of data.case() in the page's form (ranks must be < 53: JavaScript's exact integers)."""
    if c["P"] > 53:
        raise ValueError(f"size: a page draws at most 53 ranks, got {c['P']}")
    scheds = [{"steps": [[[_op_code(o["op"]), -1 if o["peer"] is None else o["peer"], *_region(o.get("dst")),
                           *_region(o.get("src")), o.get("tag", 0)] for o in ops] for ops in s["steps"]],
               "scratch_count": s["scratch_count"]} for s in c["schedules"]]
    holdings = []
    for per in c["holdings"]:
        out, prev = [], [None, None, None]
        for k, bufs in enumerate(per):
            row = []
            for b, runs in enumerate(bufs):
                flat = None if runs is None else [v for s, n, src, rs in runs for v in (s, n, src, _mask(rs))]
                row.append(UNCHANGED if k and flat is not None and flat == prev[b] else flat)
                prev[b] = flat
            out.append(row)
        holdings.append(out)
    return dict(c, schedules=scheds, holdings=holdings)


def decode_case(c: dict) -> dict:
    """encode_case's inverse (runs as lists [start, len, src, [ranks]], regions as lists)."""
    scheds = [{"steps": [[_decode_op(o) for o in ops] for ops in s["steps"]],
               "scratch_count": s["scratch_count"]} for s in c["schedules"]]
    holdings = []
    for per in c["holdings"]:
        out, prev = [], [None, None, None]
        for row in per:
            bufs = []
            for b, flat in enumerate(row):
                if flat is None:
                    runs = None
                elif not isinstance(flat, list):  # UNCHANGED
                    runs = prev[b]
                else:
                    runs = [[flat[i], flat[i + 1], flat[i + 2], _ranks(flat[i + 3])] for i in range(0, len(flat), 4)]
                bufs.append(runs)
                prev[b] = runs
            out.append(bufs)
        holdings.append(out)
    return dict(c, schedules=scheds, holdings=holdings)
