"""Formatting for the report's tables and the run's summary: numbers, times, ratios, and the peers'
availability and library names."""
from __future__ import annotations


def fmt_num(x, spec=".2f", none="–"):
    """``x`` formatted with ``spec``, or a dash for None."""
    return none if x is None else format(x, spec)


def fmt_us(x):
    """A time in µs: one decimal below 1000, none above; a dash for None."""
    if x is None:
        return "–"
    return f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def fmt_ratio(r):
    """A ratio as '1.23×', or a dash for None."""
    return "–" if r is None else f"{r:.2f}×"


def availability(datas):
    """{backend: text} across the files (MPI: not available (why))."""
    out = {}
    for d in datas:
        for name, info in d.get("backends", {}).items():
            if info.get("available"):
                lib = clean_library(info.get('library') or info.get('transport', ''))
                out[name] = f"available ({lib})".replace(" ()", "")
            elif name not in out:
                out[name] = "not requested" if info.get("requested") is False else \
                    f"not available ({info.get('reason') or info.get('error') or 'unknown'})"
    return out


def clean_library(text):
    """A library's version string cut to its first part (MPI's are long)."""
    return str(text).replace("\x00", "").split(",")[0].strip()


def mpi_library(d):
    """The MPI library of a run, or why there is none."""
    info = d.get("backends", {}).get("mpi", {})
    return clean_library(info.get("library")) if info.get("library") else (
        "not available" if not info.get("available") else "?")


def memcpy_at(memcpy, b):
    """The one-thread memcpy bandwidth measured at ``b`` bytes, or None."""
    for m in memcpy:
        if m["bytes"] == b:
            return m["GBps"]
    return None


def commlib_transport(records, P):
    """The transport commlib's records of world size ``P`` ran on (shm when none says)."""
    for r in records:
        if r["backend"] == "commlib" and r["world_size"] == P:
            return r["transport"]
    return "shm"
