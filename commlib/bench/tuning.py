"""Building auto's tuning table from measurements: ``commlib bench --tune`` and ``commlib tune``.

The table's format and its run-time half (read, install, load_default) are in :mod:`commlib.core.tuning`,
which ``import commlib`` uses; this module only builds tables. Rows for the world sizes measured
come from the measurements; rows for nearby world sizes not measured come from the fitted cost
model. A device bench's records (``<algorithm>@<path>``) give the "kernel_path" rows and the
"device_path" crossovers instead (commlib/bench/device_tuning.py).
"""
from __future__ import annotations

import os

from commlib.bench import flag_tuning, single_copy_tuning, stream_tuning
from commlib.perf.tuning_path import SWITCH_COST, TOLERANCE, choose_path, rows  # noqa: F401
from commlib.bench import tuning_picks
from commlib.bench.tuning_picks import measured_entries, measured_picks  # noqa: F401 (used here and by tests)
from commlib.core.tuning import (SCHEMA, choose, default_path, install, load_default, read,  # noqa: F401
                            rows_for, write)  # (re-exported: the bench and its tests use them here)

# Where `commlib tune` and `commlib bench --tune` write without -o / --tune-file: the current
# directory, never the package (a run must not silently change the installed tuning file).
DEFAULT_OUTPUT = "tuning.json"

MODEL_MAX_REL_ERR = 0.25  # only trust the model for unmeasured world sizes when it fits this well


def from_runs(datas, previous=None):
    """A tuning table from several bench runs (the dicts ``commlib bench --json`` writes): records
    merged, each marked with its run (``run``: its times are judged against that run's best,
    tuning_picks.relative_times), the model fits of the last run that has them. Each run's records
    keep the placement it was measured on (its config's ``hosts``, see placement_of)."""
    from commlib.bench import stream_ab
    records, fits = [], {}
    for run, d in enumerate(datas):
        hosts, per_host = placement_of(d.get("config") or {}, d.get("world_size"))
        single = (d.get("config") or {}).get("single_copy", "")
        in_force = (d.get("config") or {}).get("single_copy_in_force")
        # the "stream" section the run's ranks ran with: a run older than the record ran the rule alone
        stream_in_force = (d.get("config") or {}).get("stream_in_force", {})
        for r in d.get("results", []):
            r = dict(r, hosts=hosts, ranks_per_host=per_host, single_copy=single, run=run)
            if in_force is not None and str(single) == "auto" and r.get("backend") == "commlib":
                r["single_copy_ran"] = single_copy_tuning.side_ran(r, in_force)
            if r.get("backend") == "commlib" and stream_ab.parse(r.get("algorithm", ""))[1] is None:
                r["stream_ran"] = stream_tuning.side_ran(r, stream_in_force)
            records.append(r)
        fits.update(d.get("model") or {})
    return from_results(records, fits, previous=previous)


def provenance(datas, table):
    """What a table was tuned from and how long that took: each run's command, its single-copy
    setting ("both": --single-copy-ab, both sides in one job) and its ranks' seconds (every job of
    every pass; None for runs that predate the record), their sum, and where the single-copy section
    came from (these runs, or kept from the previous file because no run measured both sides)."""
    runs = [{"command": d.get("command", ""), "single_copy": (d.get("config") or {}).get("single_copy", ""),
             "seconds": (d.get("config") or {}).get("elapsed_s")} for d in datas]
    known = [r["seconds"] for r in runs if r["seconds"] is not None]
    records = [dict(r, single_copy=(d.get("config") or {}).get("single_copy", "")) for d in datas
               for r in d.get("results", [])]
    from commlib.bench import single_copy_ab, stream_ab
    measured = bool(single_copy_tuning.crossovers(single_copy_ab.split_records(records)))
    streams = bool(stream_tuning.starts(stream_ab.split_records(records)))
    return {"runs": runs, "tuning_seconds": round(sum(known), 1) if known else None,
            "single_copy": "measured by these runs" if measured else
            ("kept from the previous file (no run measured single-copy reads both off and on: "
             "commlib bench --single-copy-ab)" if table.get("single_copy") else "none"),
            "stream": "measured by these runs" if streams else
            ("kept from the previous file (no run measured streaming stores both off and on: "
             "commlib bench --stream-ab)" if table.get("stream") else "none")}


def placement_of(cfg, world_size=None):
    """(hosts, ranks per host) of a run from its config: ``hosts`` (``commlib bench --hosts``,
    default 1) and the bench's contiguous placement of ``world_size`` ranks on them
    (commlib.bench.hosts.host_of_ranks); ranks per host is None on one host or when unknown."""
    hosts = int(cfg.get("hosts", 1) or 1)
    P = world_size or cfg.get("world_size")
    if hosts <= 1 or not P:
        return hosts, None
    from commlib.bench.hosts import host_of_ranks
    of = host_of_ranks(int(P), hosts)
    return hosts, [of.count(h) for h in range(hosts)]


def main(args) -> int:
    """``commlib tune FILE... [-o OUT]``."""
    from commlib.bench.report import load
    datas = load(args.files)
    path = args.output or DEFAULT_OUTPUT
    if getattr(args, "machine_section", False):
        return write_machine_section(path, datas)
    previous = read(path)
    table = from_runs(datas, previous=previous)
    if getattr(args, "single_copy_only", False):  # the crossover alone: every other section as it was
        if not previous:
            raise SystemExit(f"commlib tune --single-copy-only: {path} is not a tuning file to keep the rows of")
        table = dict(previous, single_copy=table.get("single_copy", previous.get("single_copy")))
    table["provenance"] = provenance(datas, table)
    write(path, table, (datas[-1].get("machine") if datas else None))
    sizes = sorted({int(P) for per in table["collectives"].values() for P, e in per.items()
                    if e.get("source") == "measured"})
    kernel = sorted({int(P) for per in table.get("kernel_path", {}).values() for P in per})
    print(f"# tuning written to {path} from {len(datas)} run(s); measured world sizes {sizes}"
          + (f"; kernel-path rows for world sizes {kernel}" if kernel else ""))
    prov = table["provenance"]
    if prov["tuning_seconds"] is not None:
        print(f"# the runs took {prov['tuning_seconds']:.0f} s of ranks' time; single-copy section: {prov['single_copy']}")
    for coll, per in sorted((table.get("single_copy") or {}).items()):
        print(f"# single-copy reads for {coll} from: " + ", ".join(
            f"P={P} {'never' if e['min_bytes'] < 0 else str(e['min_bytes']) + ' B'}" for P, e in sorted(per.items())))
    for coll, per in sorted((table.get("flags") or {}).items()):
        print(f"# flags for {coll} up to: " + ", ".join(
            f"P={P} {'none' if e['max_bytes'] < 0 else str(e['max_bytes']) + ' B'}" for P, e in sorted(per.items())))
    for coll, per in sorted((table.get("stream") or {}).items()):
        print(f"# streaming stores for {coll} from: " + ", ".join(
            f"P={P} {'never' if e['min_bytes'] < 0 else str(e['min_bytes']) + ' B'}" for P, e in sorted(per.items())))
    if os.path.abspath(path) != os.path.abspath(default_path()):
        print(f"# use it with COMMLIB_TUNING={os.path.abspath(path)}, or install it as {default_path()}")
    return 0


def _machine_class(datas) -> dict:
    """{"cpu", "cores"} of runs that must all come from one machine class."""
    machines = {(d.get("machine") or {}).get("cpu") for d in datas}
    cores = {(d.get("machine") or {}).get("cores") for d in datas}
    if len(machines) != 1 or len(cores) != 1 or None in machines or None in cores:
        raise SystemExit(f"commlib tune --machine-section: the runs must come from one machine class "
                         f"(cpu {sorted(map(str, machines))}, cores {sorted(map(str, cores))})")
    return {"cpu": machines.pop(), "cores": int(cores.pop())}


def machine_section(datas, replaced=None) -> dict:
    """A ``"machines"`` section (commlib.core.tuning.for_machine) from bench runs of one machine class:
    the entries measured by these runs only (no model rows), their single-copy crossovers when the
    runs measured both sides, else those of ``replaced`` (the section this one replaces: main-job runs
    alone measure one side per size, and dropping the crossovers would move the class's large calls
    back to the channels), the runs' machine and provenance."""
    import time
    machine = _machine_class(datas)
    kept = (replaced or {}).get("single_copy")
    previous = {k: (replaced or {}).get(k) for k in ("single_copy", "flags", "stream") if (replaced or {}).get(k)}
    table = from_runs(datas, previous=previous or None)
    colls = {c: {P: e for P, e in per.items() if e.get("source") == "measured"}
             for c, per in table.get("collectives", {}).items()}
    section = {"machine": machine,
               "collectives": {c: per for c, per in colls.items() if per},
               "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    prov = provenance(datas, table)
    if table.get("single_copy"):  # measured by these runs, or kept
        section["single_copy"] = table["single_copy"]
    if table.get("flags"):  # where these runs saw the flags lose, else kept
        section["flags"] = table["flags"]
    if table.get("stream"):  # measured by these runs' --stream-ab, else kept
        section["stream"] = table["stream"]
    if prov["single_copy"] != "measured by these runs" and kept:
        prov["single_copy"] = ("kept from the section this one replaced (no run measured single-copy "
                               "reads both off and on: commlib bench --single-copy-ab)")
    section["provenance"] = prov
    return section


def write_machine_section(path, datas) -> int:
    """``commlib tune FILE... -o TABLE --machine-section``: TABLE with the runs' machine section
    replaced (or added); its top level and other machines' sections as they were."""
    import json
    from commlib.core.tuning import for_machine, read_strict
    machine = _machine_class(datas)
    table = read_strict(path)
    for_machine(table, machine)  # checks the existing sections
    old = [s for s in table.get("machines", []) if s["machine"] == machine]
    section = machine_section(datas, replaced=old[0] if old else None)
    others = [s for s in table.get("machines", []) if s["machine"] != section["machine"]]
    table["machines"] = others + [section]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    m = section["machine"]
    print(f"# {path}: section for {m['cpu']} ({m['cores']} cores): "
          + ", ".join(f"{c} P={','.join(sorted(per))}" for c, per in sorted(section["collectives"].items()))
          + ("" if "single_copy" not in section else "; single-copy crossovers " + (
              "measured" if section["provenance"]["single_copy"] == "measured by these runs" else "kept"))
          + "".join(f"; flags for {c} up to " + ", ".join(f"P={P} {e['max_bytes']} B" for P, e in sorted(per.items()))
                    for c, per in sorted(section.get("flags", {}).items()))
          + "".join(f"; streaming stores for {c} from " + ", ".join(
              f"P={P} {'never' if e['min_bytes'] < 0 else str(e['min_bytes']) + ' B'}" for P, e in sorted(per.items()))
                    for c, per in sorted(section.get("stream", {}).items())))
    return 0


def from_results(records, fits=None, previous=None, model_span=2, hosts=1, ranks_per_host=None):
    """A tuning table from bench records: measured world sizes from the measurements (within 10%
    of the best at every size, few switches: choose_path), and world sizes 2..model_span*max(P) not measured from the fitted model of
    the nearest measured P (when it fits within MODEL_MAX_REL_ERR). Entries of ``previous`` measured
    at other world sizes are kept.

    ``hosts`` / ``ranks_per_host``: where the records were measured (a record's own ``hosts`` /
    ``ranks_per_host`` keys, set by from_runs, take precedence). An entry measured on several hosts
    says so (``"hosts"``, with ``"ranks_per_host"``): the cost model (COMMLIB_TOPOLOGY) defers only to
    rows of the communicator's host count (commlib.core.tuning). Runs of one world size on several
    host counts cannot share an entry: the one with the most hosts is kept."""
    from commlib.perf import model
    from commlib.bench import device_tuning, single_copy_ab, stream_ab
    records = single_copy_ab.split_records(records)  # --single-copy-ab runs: both sides of one job
    records = stream_ab.split_records(records)  # --stream-ab runs: each side's job
    all_records = records
    records = device_tuning.split(records)[0]  # device records make the kernel_path / device_path sections
    records, single_copy = single_copy_tuning.choose(records, previous)
    records, stream = stream_tuning.choose(records, previous)
    records = tuning_picks.usual_mode(records)  # the rows serve the usual call's mode
    colls = {}
    if previous:
        for coll, per in previous.get("collectives", {}).items():
            for P, entry in per.items():
                if entry.get("source") == "measured":
                    colls.setdefault(coll, {})[P] = entry
    where = {}  # host count -> [records], and each host count's ranks per host
    for r in records:
        h = int(r.get("hosts", hosts))
        where.setdefault(h, ([], r.get("ranks_per_host", ranks_per_host)))[0].append(r)
    flags = tuning_picks.flag_sizes(records)
    # Up to which size auto takes the flags (one host only: they are shared memory).
    flag_section = flag_tuning.cutoffs(where.get(1, ([], None))[0], (previous or {}).get("flags"))
    picks, placed = {}, {}
    for h in sorted(where):  # more hosts last: they replace fewer hosts' picks of the same world size
        for key, series in measured_picks(where[h][0]).items():
            picks[key], placed[key] = series, (h, where[h][1])
    for (coll, P), series in sorted(picks.items()):
        if not series:
            continue
        flagged = flag_tuning.still_flagged(tuning_picks.flagged_at(flags, coll, P), series,
                                            flag_section.get(coll, {}).get(str(P)))
        best = tuning_picks.choose_picks(series, flagged)
        entry = colls.setdefault(coll, {})[str(P)] = {
            "source": "measured", "dtype": next(r["dtype"] for r in records if r["backend"] == "commlib"),
            "rows": rows([cb for _, cb, _ in series], best)}
        h, per_host = placed[(coll, P)]
        if h > 1:
            entry["hosts"] = h
            if per_host:
                entry["ranks_per_host"] = list(per_host)
    # Model-based rows for unmeasured world sizes near the measured ones.
    fits = fits or {}
    commlib_fits = {v["world_size"]: v for v in fits.values() if v.get("backend") == "commlib"}
    for (coll, Pm), series in sorted(picks.items()):
        algs = sorted(series[0][2]) if series else []
        for P in range(2, model_span * max(commlib_fits or {Pm: None}) + 1):
            if str(P) in colls.get(coll, {}) or not commlib_fits:
                continue
            near = min(commlib_fits, key=lambda q: (abs(q - P), q))
            params = commlib_fits[near]
            if params.get("rel_err_median") is None or params["rel_err_median"] > MODEL_MAX_REL_ERR:
                continue
            sizes = [b for b, _, _ in series]
            from commlib.perf.common import core_bytes
            dtype = next(r["dtype"] for r in records if r["backend"] == "commlib")
            cbs = [core_bytes(coll, b, dtype, P) for b in sizes]
            best = [model.best_by_model(params, coll, algs, float(b), P) for b in sizes]
            colls.setdefault(coll, {})[str(P)] = {"source": f"model (fit at P={near})",
                                                 "rows": rows(cbs, best)}
    out = {"schema": SCHEMA, "bytes": "per-rank count x element size, as _C.choose_algorithm sees it",
           "collectives": colls}
    if single_copy:
        out["single_copy"] = single_copy
    if flag_section:
        out["flags"] = flag_section
    if stream:
        out["stream"] = stream
    return device_tuning.add_device_sections(out, all_records, previous)
