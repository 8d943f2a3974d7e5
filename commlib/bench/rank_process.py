"""One rank process of one backend: make the backend (commlib, gloo, MPI, or commlib's engine on
device buffers), run the sweep, and write rank 0's records as a JSON part for the driver.

Rank processes started by the driver enter through ``python -m commlib.bench.launcher --backend B
--config cfg.json --out part.json`` (``worker_main``)."""
from __future__ import annotations

import argparse
import io
import json
import sys

from commlib.perf import common as C


def _progress(done, total, label):
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\x1b[K[{done}/{total}] {label}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _make_backend(name, rank=None, world_size=None, device="host", paths=None, single_copy=""):
    if device != "host":  # commlib's engine on device buffers; "nccl": NCCL's own collectives
        import commlib
        from commlib.bench.device import DeviceBackend
        C.use_device(device)
        return DeviceBackend(commlib.init(), device, nccl_peer=name == "nccl", paths=paths)
    if name == "commlib+mpi":  # one mpirun job: MPI's calls beside commlib's in every round
        from commlib.bench.mpi_peer import MpiBackend
        from commlib.bench.same_job import SameJobBackend
        mpi = MpiBackend()  # MPI_Init first: it numbers the ranks commlib.init reads
        return SameJobBackend(_make_backend("commlib", rank, world_size, single_copy=single_copy), mpi)
    if name == "commlib":
        import commlib
        from commlib.bench.backends import CommlibBackend
        kw = {}
        if rank is not None:
            kw = {"rank": rank, "world_size": world_size}
        if single_copy == "both":  # --single-copy-ab: every algorithm with reads off and on
            from commlib.bench.single_copy_ab import SingleCopyBackend
            return SingleCopyBackend(commlib.init(**kw))
        return CommlibBackend(commlib.init(**kw))
    if name == "gloo":
        from commlib.bench.gloo_peer import GlooBackend
        return GlooBackend()
    if name == "mpi":
        from commlib.bench.mpi_peer import MpiBackend
        return MpiBackend()
    raise ValueError(name)


def _close(backend):
    # the backend's own first: its sub-communicators (the device bench's paths) before their parent
    for obj, meth in ((backend, "close"), (getattr(backend, "comm", None), "close")):
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
    if name.startswith("commlib"):
        import_plugins(cfg)
    backend = _make_backend(name, device=cfg.get("device", "host"), paths=cfg.get("paths"),
                            single_copy=cfg.get("single_copy", ""))
    if name == "mpi" and cfg.get("hosts", 1) > 1:
        backend.transport = "tcp"  # launched with --mca btl tcp,self (Placement.mpi_command)
    try:
        sw = Sweep(backend, cfg, out=sys.stdout if cfg.get("print_table", True) else io.StringIO(),
                   progress=_progress)
        records = sw.run()
        info = {"available": True, "transport": backend.transport, "wrong": sw.wrong_total}
        if cfg.get("links"):
            info["links"] = cfg["links"]
        if hasattr(backend, "extra_info"):
            info.update(backend.extra_info(cfg))
        if name == "mpi":
            info["library"] = backend.library_version()
        if name.startswith("commlib"):  # what --stream-ab's driver checks each side's job ran with
            from commlib import settings
            info["stream_bytes"] = settings.get("COMMLIB_STREAM_BYTES") if settings.is_set("COMMLIB_STREAM_BYTES") else None
        if name == "commlib+mpi":
            info["inline_mpi"] = {"available": True, "transport": backend.mpi.transport, "same_job": True,
                                  "library": backend.mpi.library_version()}
        if name == "gloo":
            import torch
            info["library"] = f"gloo (torch {torch.__version__})"
        return records, sw.wrong_total, info, backend.rank
    finally:
        _close(backend)


def worker_main(argv=None) -> int:
    """Entry of a rank process started by the driver: --backend B --config cfg.json --out part.json."""
    p = argparse.ArgumentParser(prog="commlib.bench.launcher")
    p.add_argument("--backend", required=True, choices=("commlib", "gloo", "mpi", "nccl", "commlib+mpi"))
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
