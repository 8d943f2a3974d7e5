"""Formatting for the report's tables and the run's summary: numbers, times, ratios, and the peers'
availability and library names."""
from __future__ import annotations


def fmt_num(x, spec=".2f", none="–"):
    return none if x is None else format(x, spec)


def fmt_us(x):
    if x is None:
        return "–"
    return f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def fmt_ratio(r):
    return "–" if r is None else f"{r:.2f}×"


def availability(datas):
    """{backend: text} across the files (MPI: not available (why))."""
    out = {}
    for d in datas:
        for name, info in d.get("backends", {}).items():
            if info.get("available"):
                out[name] = f"available ({clean_library(info.get('library') or info.get('transport', ''))})".replace(" ()", "")
            elif name not in out:
                out[name] = "not requested" if info.get("requested") is False else \
                    f"not available ({info.get('reason') or info.get('error') or 'unknown'})"
    return out


def clean_library(text):
    return str(text).replace("\x00", "").split(",")[0].strip()


def mpi_library(d):
    info = d.get("backends", {}).get("mpi", {})
    return clean_library(info.get("library")) if info.get("library") else (
        "not available" if not info.get("available") else "?")


def memcpy_at(memcpy, b):
    for m in memcpy:
        if m["bytes"] == b:
            return m["GBps"]
    return None


def commlib_transport(records, P):
    for r in records:
        if r["backend"] == "commlib" and r["world_size"] == P:
            return r["transport"]
    return "shm"
