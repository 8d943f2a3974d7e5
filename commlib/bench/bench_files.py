"""Bench JSON files for the report and the tuner: the schema check and loading (``commlib sim
--json`` files pass through, for the report's "At scale" section)."""
from __future__ import annotations

import json


RECORD_KEYS = ("backend", "transport", "collective", "algorithm", "mode", "world_size", "dtype", "op",
               "bytes", "count", "iters", "time_us", "algbw_GBps", "busbw_GBps", "wrong")


TOP_KEYS = ("schema", "machine", "config", "world_size", "backends", "results", "memcpy")


def validate(d) -> list:
    """Problems with a bench JSON (empty when it follows the schema 'commlib-bench/1')."""
    if not isinstance(d, dict):
        return ["not a JSON object"]
    errs = [f"missing key {k!r}" for k in TOP_KEYS if k not in d]
    if d.get("schema") != "commlib-bench/1":
        errs.append(f"schema is {d.get('schema')!r}, expected 'commlib-bench/1'")
    for i, r in enumerate(d.get("results") or []):
        miss = [k for k in RECORD_KEYS if k not in r]
        if miss:
            errs.append(f"results[{i}] lacks {', '.join(miss)}")
        elif not all(k in r["time_us"] for k in ("median", "min", "max")):
            errs.append(f"results[{i}].time_us lacks median/min/max")
        if len(errs) > 10:
            break
    return errs


def load(paths):
    """The JSON documents of ``paths`` (bench or sim files); exits naming a file that is neither."""
    datas = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        from commlib.perf import sim_report
        if sim_report.is_sim(d):  # commlib sim --json: the "At scale" section
            errs = sim_report.validate(d)
            if errs:
                raise SystemExit(f"commlib report: {p} is not a commlib sim JSON: {'; '.join(errs[:5])}")
            datas.append(d)
            continue
        errs = validate(d)
        if errs:
            raise SystemExit(f"commlib report: {p} is not a commlib bench JSON: {'; '.join(errs[:5])}")
        datas.append(d)
    return datas


def merged_records(datas):
    """Every result record of ``datas``, in file order."""
    return [r for d in datas for r in d["results"]]
