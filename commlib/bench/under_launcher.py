"""A run inside a launcher (torchrun, srun, mpirun): this process is one rank; it runs commlib,
then gloo, then MPI when started by mpirun, and rank 0 finishes the run."""
from __future__ import annotations

import os

from commlib.bench.rank_process import run_backend
from commlib.bench.run_results import finish


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


def run_inside(a, cfg, command) -> int:
    """One rank of a run started by a launcher: commlib, then the peers that can run here; rank 0 finishes."""
    if cfg.get("stream_ab"):  # its sides are separate jobs, which only the local run starts
        raise SystemExit("commlib bench: --stream-ab runs local ranks only (not inside torchrun/srun/mpirun)")
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
    return finish(a, cfg, command, results, backends, status)


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
