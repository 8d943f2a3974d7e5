"""The end of a run: the JSON document (schema "commlib-bench/1"), the memcpy reference, the model
fit, the tuning file (``--tune``), the summary, ``--json`` and ``--report``.

The JSON (``report.validate`` checks it)::

    {"schema", "command", "machine": {cpu, cores, memory_gib, os, python, numpy, torch, mpi4py,
     commlib, commlib_commit, date, ...}, "config": {collectives, sizes, dtype, op, root, iters,
     warmup, rounds, check, modes, algorithms, peers, world_size}, "world_size", "timing",
     "backends": {"commlib"|"gloo"|"mpi": {available, transport, library, wrong | reason}},
     "results": [{backend, transport, collective, algorithm, resolved (what auto ran), mode
                  ("out"|"in"), world_size, dtype, op, root, bytes, count, iters, warmup, rounds,
                  time_us: {median, min, max, loop_avg}, algbw_GBps, busbw_GBps, cpu_us (all ranks'
                  CPU time per call), switches: {voluntary, involuntary} (all ranks', per call),
                  wrong}],
     "memcpy": [{bytes, time_us, GBps}], "model": {"backend/transport/P": {alpha, beta, gamma,
     n, rel_err_median, rel_err_max}}, "tuning": {...} (with --tune)}
"""
from __future__ import annotations

import json
import os
import sys

from commlib.perf import common as C


SCHEMA = "commlib-bench/1"
TIMING_NOTE = ("time = median over the timed iterations of the slowest rank's duration of each call "
               "(calls back to back after a barrier; loop_avg = slowest rank's loop time / iterations); "
               "with --passes N (local runs) every backend's job runs N times in alternating order and "
               "each row keeps its lowest median (all passes' medians in pass_medians_us)")


def finish(a, cfg, command, results, backends, status) -> int:
    """Complete the run: memcpy, fit, tuning, summary, ``--json``, ``--report``; the exit status."""
    from commlib.bench import memcpy, tuning
    from commlib.perf import model
    from commlib.bench.report import print_summary
    mem = memcpy.measure([s for s in cfg["sizes"]], iters=max(cfg["iters"], 10))
    machine = C.machine_info()
    data = {
        "schema": SCHEMA, "command": command, "machine": machine, "config": cfg,
        "world_size": cfg["world_size"], "timing": TIMING_NOTE, "backends": backends,
        "results": results, "memcpy": mem,
    }
    # The fit simulates each algorithm measured: those registered by --import too, here as on the ranks.
    from commlib.bench.rank_process import import_plugins
    import_plugins(cfg)
    data["model"] = model.fit_results(results)
    if a.tune:
        path = a.tune_file or tuning.DEFAULT_OUTPUT
        hosts, per_host = tuning.placement_of(cfg, cfg["world_size"])
        table = tuning.from_results(results, data["model"], previous=tuning.read(path), hosts=hosts,
                                    ranks_per_host=per_host)
        tuning.write(path, table, machine)
        data["tuning"] = table
        C.log(f"# tuning written to {path}")
        try:
            tuning.install(table)
        except Exception as e:
            C.log(f"# tuning not installed in this process: {e}")
    print_summary(data, sys.stdout)
    if cfg.get("device", "host") != "host":  # our best against the NCCL peer (commlib/bench/device.py)
        from commlib.bench import device
        sys.stdout.write("\n" + device.markdown(data))
    if a.json:
        d = os.path.dirname(os.path.abspath(a.json))
        os.makedirs(d, exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(data, f, indent=1)
        C.log(f"# wrote {a.json}")
    if a.report:
        from commlib.bench import report
        path = report.generate([data], a.report, getattr(a, "explorer", None))
        C.log(f"# report: {path}")
    wrong = sum(int(r.get("wrong") or 0) for r in results)
    if wrong:
        print(f"!!! {wrong} WRONG VALUES in this run (see '<-- WRONG' rows above)", file=sys.stderr, flush=True)
        status = 1
    return status
