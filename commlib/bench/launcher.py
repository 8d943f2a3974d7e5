"""``commlib bench``: start the ranks, run commlib and the peers, merge, fit, tune, report.

Two ways to run:

* **local** (no RANK/WORLD_SIZE in the environment): this process is a driver. It starts ``--np``
  rank processes for commlib (``python -m commlib.bench.launcher --backend commlib``, rendezvous
  through ``commlib.init`` on a free port), then ``--np`` processes for gloo (torch.distributed),
  then one ``mpirun -np N python -m commlib.bench.launcher --backend mpi`` job, each writing its records to a
  JSON part that the driver merges with a one-thread memcpy measurement. Rank 0 of each job prints
  its table as it runs.
* **inside a launcher** (torchrun, srun, mpirun: RANK/WORLD_SIZE, SLURM_* or OMPI_* set): this
  process is one rank; it runs commlib, then gloo, then MPI when started by mpirun, and rank 0
  writes the JSON.

The JSON (``--json``, schema "commlib-bench/1"; ``report.validate`` checks it)::

    {"schema", "command", "machine": {cpu, cores, memory_gib, os, python, numpy, torch, mpi4py,
     commlib, commlib_commit, date, ...}, "config": {collectives, sizes, dtype, op, root, iters,
     warmup, rounds, check, modes, algorithms, peers, world_size}, "world_size", "timing",
     "backends": {"commlib"|"gloo"|"mpi": {available, transport, library, wrong | reason}},
     "results": [{backend, transport, collective, algorithm, resolved (what auto ran), mode
                  ("out"|"in"), world_size, dtype, op, root, bytes, count, iters, warmup, rounds,
                  time_us: {median, min, max, loop_avg}, algbw_GBps, busbw_GBps, wrong}],
     "memcpy": [{bytes, time_us, GBps}], "model": {"backend/transport/P": {alpha, beta, gamma,
     n, rel_err_median, rel_err_max}}, "tuning": {...} (with --tune)}
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

from commlib.bench import common as C
from commlib.bench.hosts import Placement

SCHEMA = "commlib-bench/1"
TIMING_NOTE = ("time = median over the timed iterations of the slowest rank's duration of each call "
               "(calls back to back after a barrier; loop_avg = slowest rank's loop time / iterations); "
               "with --passes N (local runs) every backend's job runs N times in alternating order and "
               "each row keeps its lowest median (all passes' medians in pass_medians_us)")


# -- arguments -------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser):
    p.add_argument("collectives", nargs="*", metavar="COLL",
                   help=f"collectives to run (default: {' '.join(C.DEFAULT_COLLECTIVES)}; 'all' adds "
                        "reduce, gather, scatter)")
    p.add_argument("--np", type=int, default=4, dest="np_",
                   help="local ranks to start (ignored inside torchrun/srun/mpirun; default 4)")
    p.add_argument("--hosts", type=int, default=1,
                   help="local runs: split the ranks into this many emulated hosts (contiguous rank "
                        "groups, COMMLIB_HOST_ID): shared memory inside a host, TCP between hosts "
                        "(default 1). COMMLIB_SOCKET_IFNAME picks the interface (default here: lo); "
                        "Open MPI then uses --mca btl tcp,self so it crosses the same kind of link")
    p.add_argument("--netns", action="store_true",
                   help="with --hosts H: run each host's ranks in its own network namespace "
                        "(scripts/netns.sh, root only), joined by veth links: real TCP between hosts "
                        "for commlib, gloo and Open MPI alike")
    p.add_argument("--rate", metavar="RATE",
                   help="with --netns: limit every inter-host link to RATE each way (tc tbf; e.g. 1gbit)")
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", default="16M", help="largest size, always included (default 16M)")
    p.add_argument("-f", "--stepfactor", type=float, default=4.0, help="size factor (default 4)")
    p.add_argument("-i", "--stepbytes", default="0", help="arithmetic step instead of -f (default 0: use -f)")
    p.add_argument("--algorithms", default="all",
                   help="comma list of commlib algorithms, 'auto' included (default: all + auto)")
    p.add_argument("--peers", default=None,
                   help="comma list of gloo, mpi, nccl (with --device), or 'none' (default gloo,mpi; "
                        "with --device: nccl)")
    p.add_argument("--device", default="host", choices=("host", "emulated", "cuda"),
                   help="where the buffers live: host memory (default), commlib.emulated arrays or CUDA "
                        "tensors (the stream engine; commlib/bench/device.py)")
    p.add_argument("-d", "--datatype", default="float32", choices=C.DTYPES, help="element type (default float32)")
    p.add_argument("-o", "--op", default="sum", choices=C.OPS, help="reduction (default sum)")
    p.add_argument("-r", "--root", type=int, default=0, help="root of rooted collectives (default 0)")
    p.add_argument("-n", "--iters", type=int, default=20,
                   help="timed calls per algorithm and size, at least (default 20)")
    p.add_argument("--min-time", type=float, default=0.02,
                   help="time fast calls for about this many seconds per algorithm and size, up to "
                        "--max-iters calls (default 0.02; 0: exactly -n calls)")
    p.add_argument("--max-iters", type=int, default=1000, help="cap of the --min-time rule (default 1000)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="warm-up iterations (default 5)")
    p.add_argument("--passes", type=int, default=2,
                   help="local runs: run every backend's job this many times, alternating the order "
                        "(commlib, gloo, mpi, then mpi, gloo, commlib, ...), and keep each row's lowest "
                        "median: a burst of load during one backend's job then does not decide a ratio "
                        "(default 2; the table is printed in the last pass)")
    p.add_argument("--rounds", type=int, default=4,
                   help="interleave the algorithms of a size in this many rounds of iters/rounds calls (default 4)")
    p.add_argument("-c", "--check", type=int, default=1, help="check results (1, default) or not (0)")
    p.add_argument("--mode", choices=("both", "out", "in"), default="both",
                   help="commlib: out-of-place, in-place or both columns (default both)")
    p.add_argument("--json", metavar="FILE", help="write every sample here")
    p.add_argument("--report", metavar="DIR", help="then write the report (index.html, report.md) here")
    p.add_argument("--tune", action="store_true",
                   help="write the tuning file from these measurements (auto's choices)")
    p.add_argument("--tune-file", metavar="FILE",
                   help="tuning file to write (default: ./tuning.json; commlib/tuning.json only when named)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per job before it is killed (default 900)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE in every commlib rank first, e.g. one that calls "
                        "commlib.register_algorithm (repeatable; found on PYTHONPATH or in the current directory)")


def config_from_args(a) -> dict:
    colls = a.collectives or list(C.DEFAULT_COLLECTIVES)
    if "all" in colls:
        colls = list(C.COLLECTIVES)
    for c in colls:
        if c not in C.COLLECTIVES:
            raise SystemExit(f"commlib bench: unknown collective {c!r} (choose from {', '.join(C.COLLECTIVES)})")
    sizes = C.size_list(C.parse_size(a.minbytes), C.parse_size(a.maxbytes), a.stepfactor,
                        C.parse_size(a.stepbytes))
    device = getattr(a, "device", "host")
    peer_list = a.peers if a.peers is not None else ("gloo,mpi" if device == "host" else "nccl")
    peers = [p for p in peer_list.split(",") if p and p != "none"]
    for p in peers:
        if p not in ("gloo", "mpi", "nccl"):
            raise SystemExit(f"commlib bench: unknown peer {p!r} (gloo, mpi, nccl or none)")
    from commlib.bench import device as device_bench
    device_bench.check_config(device, a.datatype, peers)
    if a.op in ("band", "bor", "bxor") and a.datatype.startswith(("float", "bfloat")):
        raise SystemExit(f"commlib bench: -o {a.op} needs an integer -d (got {a.datatype})")
    return {
        "collectives": colls, "sizes": sizes, "dtype": a.datatype, "op": a.op, "root": a.root,
        "iters": a.iters, "min_time": a.min_time, "max_iters": a.max_iters, "warmup": a.warmup_iters,
        "check": bool(a.check), "rounds": a.rounds,
        "modes": ["out", "in"] if a.mode == "both" else [a.mode],
        "algorithms": [x for x in a.algorithms.split(",") if x], "peers": peers, "device": device,
        "imports": list(getattr(a, "imports", []) or []),
    }


# -- one rank of one backend -------------------------------------------------------------------------
def _progress(done, total, label):
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\x1b[K[{done}/{total}] {label}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _make_backend(name, rank=None, world_size=None, device="host"):
    if device != "host":  # commlib's engine on device buffers; "nccl": NCCL's own collectives
        import commlib
        from commlib.bench.device import DeviceBackend
        C.use_device(device)
        return DeviceBackend(commlib.init(), device, nccl_peer=name == "nccl")
    if name == "commlib":
        import commlib
        from commlib.bench.sweep import CommlibBackend
        kw = {}
        if rank is not None:
            kw = {"rank": rank, "world_size": world_size}
        return CommlibBackend(commlib.init(**kw))
    if name == "gloo":
        from commlib.bench.gloo_peer import GlooBackend
        return GlooBackend()
    if name == "mpi":
        from commlib.bench.mpi_peer import MpiBackend
        return MpiBackend()
    raise ValueError(name)


def _close(backend):
    for obj, meth in ((getattr(backend, "comm", None), "close"), (backend, "close")):
        f = getattr(obj, meth, None)
        if callable(f):
            try:
                f()
            except Exception:
                pass


def import_plugins(cfg: dict):
    """Import the modules of ``--import`` (algorithms registered from Python: every rank imports
    the same modules in the same order, so the algorithms get the same indices everywhere)."""
    import importlib
    for module in cfg.get("imports", []):
        importlib.import_module(module)


def run_backend(name: str, cfg: dict):
    """Run one backend's sweep in this (rank) process; return (records, wrong_total, info)."""
    from commlib.bench.sweep import Sweep
    if name == "commlib":
        import_plugins(cfg)
    backend = _make_backend(name, device=cfg.get("device", "host"))
    if name == "mpi" and cfg.get("hosts", 1) > 1:
        backend.transport = "tcp"  # launched with --mca btl tcp,self (Placement.mpi_command)
    try:
        sw = Sweep(backend, cfg, out=sys.stdout if cfg.get("print_table", True) else io.StringIO(),
                   progress=_progress)
        records = sw.run()
        info = {"available": True, "transport": backend.transport, "wrong": sw.wrong_total}
        if cfg.get("links"):
            info["links"] = cfg["links"]
        if name == "mpi":
            info["library"] = backend.library_version()
        if name == "gloo":
            import torch
            info["library"] = f"gloo (torch {torch.__version__})"
        return records, sw.wrong_total, info, backend.rank
    finally:
        _close(backend)


def worker_main(argv=None) -> int:
    """Entry of a rank process started by the driver: --backend B --config cfg.json --out part.json."""
    p = argparse.ArgumentParser(prog="commlib.bench.launcher")
    p.add_argument("--backend", required=True, choices=("commlib", "gloo", "mpi", "nccl"))
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    with open(a.config) as f:
        cfg = json.load(f)
    records, wrong, info, rank = run_backend(a.backend, cfg)
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump({"backend": a.backend, "info": info, "records": records}, f)
    return 1 if wrong else 0


# -- the driver --------------------------------------------------------------------------------------
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


def external_launch() -> bool:
    """True when started by torchrun/srun/mpirun as one rank of several."""
    e = os.environ
    if "RANK" in e and "WORLD_SIZE" in e:
        return True
    if int(e.get("OMPI_COMM_WORLD_SIZE", "1")) > 1 or int(e.get("PMI_SIZE", "1")) > 1:
        return True
    return int(e.get("SLURM_STEP_NUM_TASKS", "1")) > 1  # a task of a multi-task srun step


def _world_size_env():
    e = os.environ
    for k in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"):
        if k in e:
            return int(e[k])
    return 1


def run(a) -> int:
    cfg = config_from_args(a)
    command = "commlib bench " + " ".join(shlex.quote(x) for x in sys.argv[2:]) \
        if len(sys.argv) > 1 and sys.argv[1] == "bench" else "commlib bench"
    if external_launch():
        return _run_inside(a, cfg, command)
    P = a.np_
    if P < 1:
        raise SystemExit("commlib bench: --np must be >= 1")
    cfg["world_size"] = P
    if not 1 <= a.hosts <= P:
        raise SystemExit("commlib bench: --hosts must be in 1..--np")
    if a.rate and not a.netns:
        raise SystemExit("commlib bench: --rate needs --netns (it limits the links between namespaces)")
    if a.netns and a.hosts < 2:
        raise SystemExit("commlib bench: --netns needs --hosts 2 or more")
    cfg["hosts"] = a.hosts
    if not a.netns:
        return _run_local(a, cfg, command, Placement(P, a.hosts))
    from commlib.testing.netns import Namespaces, NetnsUnavailable
    try:
        with Namespaces(a.hosts, rate=a.rate) as net:
            return _run_local(a, cfg, command, Placement(P, a.hosts, net, a.rate))
    except NetnsUnavailable as e:
        raise SystemExit(f"commlib bench: --netns: {e}") from None


def _run_local(a, cfg, command, place) -> int:
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
    return _finish(a, cfg, command, results, backends, status)


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


def _run_inside(a, cfg, command) -> int:
    P = _world_size_env()
    cfg["world_size"] = P
    results, backends, status = [], {}, 0
    records, wrong, info, rank = run_backend("commlib", cfg)
    results += records
    backends["commlib"] = info
    status |= int(bool(wrong))
    if "gloo" in cfg["peers"]:
        try:
            _init_gloo_inside()
            records, wrong, info, _ = run_backend("gloo", cfg)
            results += records
            backends["gloo"] = info
        except Exception as e:
            backends["gloo"] = {"available": False, "reason": f"{type(e).__name__}: {e}"}
    if "mpi" in cfg["peers"]:
        if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ:
            try:
                records, wrong, info, _ = run_backend("mpi", cfg)
                results += records
                backends["mpi"] = info
            except Exception as e:
                backends["mpi"] = {"available": False, "reason": f"{type(e).__name__}: {e}"}
        else:
            backends["mpi"] = {"available": False,
                               "reason": "not started by mpirun (run the bench under mpirun, or "
                                         "locally with --np, to measure MPI)"}
    if rank != 0:
        return status
    return _finish(a, cfg, command, results, backends, status)


def _init_gloo_inside():
    import torch.distributed as dist
    if dist.is_initialized():
        return
    e = os.environ
    rank = int(e.get("RANK", e.get("OMPI_COMM_WORLD_RANK", e.get("PMI_RANK", e.get("SLURM_PROCID", "0")))))
    size = _world_size_env()
    if e.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        dist.init_process_group("gloo", rank=rank, world_size=size)
        return
    addr = e.get("MASTER_ADDR", "127.0.0.1")
    port = int(e.get("MASTER_PORT", "29500")) + 1  # commlib's store has MASTER_PORT
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=size)


def _finish(a, cfg, command, results, backends, status) -> int:
    from commlib.bench import memcpy, model, tuning
    from commlib.bench.report import print_summary
    mem = memcpy.measure([s for s in cfg["sizes"]], iters=max(cfg["iters"], 10))
    machine = C.machine_info()
    data = {
        "schema": SCHEMA, "command": command, "machine": machine, "config": cfg,
        "world_size": cfg["world_size"], "timing": TIMING_NOTE, "backends": backends,
        "results": results, "memcpy": mem,
    }
    data["model"] = model.fit_results(results)
    if a.tune:
        path = a.tune_file or tuning.DEFAULT_OUTPUT
        table = tuning.from_results(results, data["model"], previous=tuning.read(path))
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
        path = report.generate([data], a.report)
        C.log(f"# report: {path}")
    wrong = sum(int(r.get("wrong") or 0) for r in results)
    if wrong:
        print(f"!!! {wrong} WRONG VALUES in this run (see '<-- WRONG' rows above)", file=sys.stderr, flush=True)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(worker_main())
