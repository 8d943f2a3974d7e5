"""The driver of a local run (no launcher around it): start every backend's ranks as jobs, in
alternating order over ``--passes``, and merge each row's best pass.

Each job writes rank 0's records to a JSON part (rank_process.py); MPI runs as one ``mpirun`` job.
Where the ranks run (emulated hosts, network namespaces) is commlib/bench/hosts.py's Placement."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from commlib import settings
from commlib.bootstrap.ports import free_port
from commlib.perf import common as C
from commlib.bench.run_results import finish


def _run_job(procs_args, timeout, label):
    """Start processes [(cmd, env)], wait; kill the rest if one fails. Return (ok, message)."""
    procs = []
    try:
        for cmd, env in procs_args:
            procs.append(subprocess.Popen(cmd, env=env))
        deadline = time.monotonic() + timeout
        failed_at = None
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            bad = [c for c in codes if c not in (None, 0)]
            now = time.monotonic()
            if bad and failed_at is None:
                failed_at = now
            if (failed_at is not None and now - failed_at > 10) or now > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                for p in procs:
                    p.wait()
                why = "timed out" if now > deadline else "a rank failed; the others were stopped"
                return False, f"{label}: {why} (exit codes {[p.returncode for p in procs]})"
            time.sleep(0.05)
        codes = [p.returncode for p in procs]
        if any(codes):
            return False, f"{label}: exit codes {codes}"
        return True, ""
    except BaseException:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        raise


def _env(extra):
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


def _launch_local(name, cfg_path, part, timeout, place):
    argv = [sys.executable, "-m", "commlib.bench.launcher", "--backend", name, "--config", cfg_path, "--out", part]
    return _run_job(place.rank_commands(argv, _env), timeout, name)


def _launch_mpi(cfg_path, part, timeout, place, backend="mpi"):
    """One ``mpirun`` job of ``backend``: "mpi", or same_job.INLINE (commlib's ranks under mpirun,
    MPI's calls in their rounds; commlib's store on a free local port)."""
    from commlib.bench import mpi_peer
    ok, where = mpi_peer.available()
    if not ok:
        return False, where
    cmd, extra = place.mpi_command(mpi_peer.mpirun_command(where, place.P, ["--config", cfg_path, "--out", part],
                                                           backend=backend))
    C.log(f"# {backend}: " + " ".join(cmd[:cmd.index(sys.executable)]))
    env = _env(extra)
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    if backend != "mpi":
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    return _run_job([(cmd, env)], timeout, backend)


def job_order(cfg, place, mpi_ok: bool):
    """The jobs of one pass, in the first pass's order: commlib's (with MPI's calls in it when
    MPI is a peer on one host and ``peer_jobs`` is "same", same_job.py), then each other peer's."""
    from commlib.bench.same_job import INLINE
    peers = list(cfg["peers"])
    if "mpi" in peers and mpi_ok and place.hosts == 1 and cfg.get("peer_jobs", "same") == "same":
        jobs = [INLINE] + [p for p in peers if p != "mpi"]
    else:
        jobs = ["commlib"] + peers
    if cfg.get("stream_ab"):  # commlib's job once per side of streaming stores (stream_ab.py)
        from commlib.bench import stream_ab
        jobs = [stream_ab.job_name(jobs[0], s) for s in stream_ab.SIDES] + jobs[1:]
    return jobs


def run_local(a, cfg, command, place) -> int:
    """The local run: every backend's job in each pass, merged; then ``finish``."""
    P = place.P
    cfg["links"] = place.links()
    results, backends, status = [], {}, 0
    with tempfile.TemporaryDirectory(prefix="commlib-bench-") as tmp:
        cfg_path = os.path.join(tmp, "config.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        C.log(f"# commlib bench: {P} ranks, links: {cfg['links']}" +
              f", {len(cfg['sizes'])} sizes "
              f"({C.fmt_bytes(cfg['sizes'][0])}..{C.fmt_bytes(cfg['sizes'][-1])}), "
              f"{', '.join(cfg['collectives'])}; peers: {', '.join(cfg['peers']) or 'none'}")
        t0 = time.monotonic()
        passes = max(1, a.passes)
        per_pass = []
        from commlib.bench import mpi_peer, same_job, stream_ab
        jobs = job_order(cfg, place, mpi_peer.available()[0])
        cfg["jobs"] = jobs  # recorded in the JSON's config
        for k in range(passes):
            order = list(jobs)
            if k % 2:
                order.reverse()
            pcfg = dict(cfg, print_table=(k == passes - 1))
            pcfg_path = os.path.join(tmp, f"config{k}.json")
            with open(pcfg_path, "w") as f:
                json.dump(pcfg, f)
            if passes > 1:
                C.log(f"# pass {k + 1}/{passes}: {', '.join(order)}")
            got_pass = []
            for job in order:
                name, side = stream_ab.parse_job(job)
                if name in backends and not backends[name].get("available", True):
                    continue  # unavailable in an earlier pass (e.g. no MPI): do not retry
                part = os.path.join(tmp, f"{job}{k}.json")
                with settings.overridden(stream_ab.job_env(side)):
                    if name in ("mpi", same_job.INLINE):
                        ok, msg = _launch_mpi(pcfg_path, part, a.timeout, place, backend=name)
                    else:
                        ok, msg = _launch_local(name, pcfg_path, part, a.timeout, place)
                if name == same_job.INLINE and not ok and not os.path.exists(part):
                    # MPI is there but its job wrote nothing (mpirun or MPI's set-up failed): MPI's
                    # column is lost, never commlib's. commlib runs alone, now and in later passes.
                    C.log(f"# {name}: {msg}; running commlib alone, without MPI's series")
                    backends["mpi"] = {"available": False, "error": msg, "reason": f"the commlib+mpi job failed: {msg}"}
                    jobs[jobs.index(job)] = stream_ab.job_name("commlib", side)
                    job = stream_ab.job_name("commlib", side)
                    name = "commlib"
                    part = os.path.join(tmp, f"{job}{k}.json")
                    with settings.overridden(stream_ab.job_env(side)):
                        ok, msg = _launch_local(name, pcfg_path, part, a.timeout, place)
                if os.path.exists(part):
                    with open(part) as f:
                        got = json.load(f)
                    got_pass += stream_ab.named_side(got["records"], side, got["info"])
                    if name == same_job.INLINE:
                        backends.update(same_job.split_parts(got)[1])
                    else:
                        backends[name] = got["info"]
                    if got["info"].get("wrong"):
                        status = 1
                if name == same_job.INLINE:
                    name = "commlib"  # a failed job is commlib's failure (MPI's record says why below)
                if not ok:
                    backends.setdefault(name, {})
                    backends[name].update({"available": backends[name].get("available", False), "error": msg})
                    if "reason" not in backends[name] and not backends[name]["available"]:
                        backends[name]["reason"] = msg
                    C.log(f"# {name}: {msg}")
                    if name == "commlib":
                        status = 1
            per_pass.append(got_pass)
        results = merge_passes(per_pass, cfg.get("pass_statistic", "min"))
        cfg["passes"] = passes
        if same_job.INLINE in jobs and "mpi" not in backends:
            backends["mpi"] = {"available": False, "reason": "the commlib+mpi job wrote nothing"}
        for name in ("gloo", "mpi"):
            if name not in cfg["peers"]:
                backends.setdefault(name, {"available": False, "requested": False, "reason": "not requested"})
        cfg["elapsed_s"] = round(time.monotonic() - t0, 1)  # every job of every pass (commlib tune's provenance)
        C.log(f"# ranks done in {cfg['elapsed_s']:.0f} s")
    return finish(a, cfg, command, results, backends, status)


def _row_key(r):
    return (r["backend"], r["collective"], r["algorithm"], r["mode"], r["bytes"], r["dtype"], r["op"],
            r["root"], r["world_size"])


def merge_passes(per_pass, statistic="min"):
    """One record per row from several passes, every backend treated alike, with every pass's
    median kept in ``pass_medians_us``; #wrong summed. ``statistic``: "min" (the default) keeps the
    pass with the lowest median whole; "median" makes the row's time the median of its passes'
    medians (of two, their mean; the rest of the record, CPU and switches included, is the pass
    with the lower median). The lowest stays the default: on session 23's three quiet runs of the
    main job the median of the two passes gave auto 5 / 3 / 7 misses of 60 against the lowest's
    5 / 2 / 4 with the same table (bench/RESULTS_collectives.md, session 24)."""
    if statistic not in ("median", "min"):
        raise ValueError(f"pass statistic {statistic!r}: median or min")
    best, medians, wrong, ats = {}, {}, {}, {}
    order = []
    for records in per_pass:
        for r in records:
            k = _row_key(r)
            if k not in best:
                order.append(k)
                best[k] = r
            elif r["time_us"]["median"] < best[k]["time_us"]["median"]:
                best[k] = r
            medians.setdefault(k, []).append(r["time_us"]["median"])
            ats.setdefault(k, []).append(r.get("at"))
            if r.get("wrong") is not None:
                wrong[k] = wrong.get(k, 0) + int(r["wrong"])
    out = []
    for k in order:
        r = dict(best[k])
        if len(per_pass) > 1:
            r["pass_medians_us"] = medians[k]
            r["pass_at"] = ats[k]  # each pass's [began, ended] wall clock (bench/spells.py --levels)
            r["pass_statistic"] = statistic
            if statistic == "median" and len(medians[k]) > 1:
                med = float(np.median(medians[k]))
                r["time_us"] = dict(r["time_us"], median=med)
                r["algbw_GBps"], r["busbw_GBps"] = C.bandwidths(r["collective"], r["bytes"], r["world_size"], med * 1e-6)
        if k in wrong:
            r["wrong"] = wrong[k]
        out.append(r)
    return out
