"""The nccl-tests table, with an algorithm column.

    #       size         count      type   redop    root  algorithm        time   algbw   busbw #wrong ...
    #        (B)    (elements)                                               (us)  (GB/s)  (GB/s)        ...
             1024           256   float32     sum      -1  ring            12.31    0.08    0.12      0 ...
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 1.234  ring

One block per (backend, collective); each size has a row per algorithm (measured interleaved).

time is the median over iterations of the slowest rank's time per call (see sweep.py);
algbw = size / time, busbw = algbw * factor (common.bus_factor). "N/A": mode not measured.
"""
from __future__ import annotations

import sys

MODE_TITLE = {"out": "out-of-place", "in": "in-place"}


def fmt_time(us: float) -> str:
    if us >= 1e6:
        return f"{us:7.0f}"
    if us >= 1e4:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def format_cols(rec) -> str:
    """'   time   algbw   busbw #wrong' for one record (None -> N/A)."""
    if rec is None:
        return f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}"
    wrong = rec.get("wrong")
    w = "N/A" if wrong is None else str(int(wrong))
    return (f"  {fmt_time(rec['time_us']['median'])}  {rec['algbw_GBps']:6.2f}  "
            f"{rec['busbw_GBps']:6.2f}  {w:>6}")


ALG_W = 18


def header_lines(modes=("out", "in")):
    pre = f"#  {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}  {'':<{ALG_W}}"
    titles = "".join(f"  {MODE_TITLE[m]:^33}" for m in modes)
    l1 = pre + titles
    l2 = (f"#  {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}  {'algorithm':<{ALG_W}}"
          + "".join(f"  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}" for _ in modes))
    l3 = (f"#  {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}  {'':<{ALG_W}}"
          + "".join(f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}" for _ in modes))
    return [l1.rstrip(), l2, l3.rstrip()]


def format_row(size, count, dtype, redop, root, cols: dict, modes=("out", "in"), algorithm="") -> str:
    line = f"   {size:>10}  {count:>12}  {dtype:>8}  {redop:>6}  {root:>6}  {algorithm:<{ALG_W}.{ALG_W}}"
    line += "".join(format_cols(cols.get(m)) for m in modes)
    bad = sum(int(r.get("wrong") or 0) for r in cols.values() if r)
    if bad:
        line += f"   <-- {bad} WRONG"
    return line


class Table:
    """Streams one block of the table to ``out`` as rows arrive."""

    def __init__(self, collective, world_size, out=sys.stdout, modes=("out", "in")):
        self.collective = collective
        self.P = world_size
        self.out = out
        self.modes = tuple(modes)
        self.busbw = {}  # algorithm -> [busbw]
        self.wrong = 0

    def _print(self, s):
        isatty = getattr(self.out, "isatty", None)
        if isatty and isatty() and sys.stderr.isatty():
            s = "\r\x1b[K" + s  # erase the progress line (stderr) first
        print(s, file=self.out, flush=True)

    def header(self, title):
        self._print("#")
        self._print(f"# {title}")
        for line in header_lines(self.modes):
            self._print(line)

    def row(self, size, count, dtype, redop, root, cols, algorithm=""):
        for r in cols.values():
            if r is not None:
                self.busbw.setdefault(algorithm, []).append(r["busbw_GBps"])
                self.wrong += int(r.get("wrong") or 0)
        self._print(format_row(size, count, dtype, redop, root, cols, self.modes, algorithm))
        if any(int((r or {}).get("wrong") or 0) for r in cols.values()):
            print(f"!!! {self.collective}: WRONG RESULTS at {size} B: "
                  + ", ".join(f"{m}: {r['wrong']}" for m, r in cols.items() if r and r.get("wrong")),
                  file=sys.stderr, flush=True)

    def footer(self):
        """'# Out of bounds values' and one '# Avg bus bandwidth' line per algorithm; returns the
        average over every row."""
        status = "OK" if self.wrong == 0 else "FAILED"
        self._print(f"# Out of bounds values : {self.wrong} {status}")
        for alg, vals in self.busbw.items():
            self._print(f"# Avg bus bandwidth    : {sum(vals) / len(vals):.4f}  {alg}".rstrip())
        every = [v for vals in self.busbw.values() for v in vals]
        return sum(every) / len(every) if every else 0.0
