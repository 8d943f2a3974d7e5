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


def _launch_mpi(cfg_path, part, timeout, place):
    from commlib.bench import mpi_peer
    ok, where = mpi_peer.available()
    if not ok:
        return False, where
    cmd, extra = place.mpi_command(mpi_peer.mpirun_command(where, place.P, ["--config", cfg_path, "--out", part]))
    C.log("# mpi: " + " ".join(cmd[:cmd.index(sys.executable)]))
    env = _env(extra)
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return _run_job([(cmd, env)], timeout, "mpi")


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
        for k in range(passes):
            order = ["commlib"] + cfg["peers"]
            if k % 2:
                order.reverse()
            pcfg = dict(cfg, print_table=(k == passes - 1))
            pcfg_path = os.path.join(tmp, f"config{k}.json")
            with open(pcfg_path, "w") as f:
                json.dump(pcfg, f)
            if passes > 1:
                C.log(f"# pass {k + 1}/{passes}: {', '.join(order)}")
            got_pass = []
            for name in order:
                if name in backends and not backends[name].get("available", True):
                    continue  # unavailable in an earlier pass (e.g. no MPI): do not retry
                part = os.path.join(tmp, f"{name}{k}.json")
                if name == "mpi":
                    ok, msg = _launch_mpi(pcfg_path, part, a.timeout, place)
                else:
                    ok, msg = _launch_local(name, pcfg_path, part, a.timeout, place)
                if os.path.exists(part):
                    with open(part) as f:
                        got = json.load(f)
                    got_pass += got["records"]
                    backends[name] = got["info"]
                    if got["info"].get("wrong"):
                        status = 1
                if not ok:
                    backends.setdefault(name, {})
                    backends[name].update({"available": backends[name].get("available", False), "error": msg})
                    if "reason" not in backends[name] and not backends[name]["available"]:
                        backends[name]["reason"] = msg
                    C.log(f"# {name}: {msg}")
                    if name == "commlib":
                        status = 1
            per_pass.append(got_pass)
        results = merge_passes(per_pass)
        cfg["passes"] = passes
        for name in ("gloo", "mpi"):
            if name not in cfg["peers"]:
                backends.setdefault(name, {"available": False, "requested": False, "reason": "not requested"})
        C.log(f"# ranks done in {time.monotonic() - t0:.0f} s")
    return finish(a, cfg, command, results, backends, status)


def _row_key(r):
    return (r["backend"], r["collective"], r["algorithm"], r["mode"], r["bytes"], r["dtype"], r["op"],
            r["root"], r["world_size"])


def merge_passes(per_pass):
    """One record per row from several passes: the pass with the lowest median (every backend is
    treated alike), with every pass's median kept in ``pass_medians_us``; #wrong summed."""
    best, medians, wrong = {}, {}, {}
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
            if r.get("wrong") is not None:
                wrong[k] = wrong.get(k, 0) + int(r["wrong"])
    out = []
    for k in order:
        r = dict(best[k])
        if len(per_pass) > 1:
            r["pass_medians_us"] = medians[k]
        if k in wrong:
            r["wrong"] = wrong[k]
        out.append(r)
    return out
