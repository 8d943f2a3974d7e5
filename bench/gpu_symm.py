"""torch's symmetric-memory all_reduce as a peer column (issue #38): ``one_shot`` and ``two_shot``
(``torch.ops.symm_mem``) with several ranks on one GPU, timed as bench/gpu_latency.py times
commlib's, beside commlib's mapped all_reduce and the device copy in the same job
(scripts/gpu_check.sh, step ``bench_symm``: the bench step's ranks and sizes).

    python3 bench/gpu_symm.py --np 4 [--json out.json]
    python3 bench/gpu_symm.py --np 4 --allow-overlap 0   # torch's default: its refusal, if any
    python3 bench/gpu_symm.py --np 2 --sizes 64K --ours ''   # torch's rows only

Every rank is on GPU 0, so torch's rendezvous sees allocations from one device on several ranks,
which it refuses unless TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 (its own switch for this case;
``--allow-overlap 1``, the default, sets it in the ranks). Where torch will not run a call (no
CUDA, no symmetric memory in this torch, the rendezvous or the op refused), the rows say
``refused: <torch's reason>`` and the step still succeeds: the refusal is the result. The table is
gpu_latency's (path ``torch symm`` for torch's rows, ``kernel`` for commlib's, ``floor`` for the
copy), so the rows read beside the bench step's and against the same floors.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_latency  # noqa: E402 (bench/ is no package)

ALGORITHMS = ("one_shot", "two_shot")
# The bench step's sizes (scripts/gpu_check.sh bench_small: -b 16 -e 1M -f 4; bench_large: -b 64M -e 256M -f 4).
SIZES = (16, 64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 64 << 20, 256 << 20)
# commlib's side in the same job: the mapped all_reduces whose targets the bench step measures.
OURS = ("mapped_one_shot", "mapped_fused_two_shot")
OVERLAP_ENV = "TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"
PATH = "torch symm"


def unavailable(torch) -> str | None:
    """Why torch's symmetric-memory all_reduce cannot run here at all, or None (then try it)."""
    try:  # (importlib: an `import torch.distributed...` here would rebind `torch`)
        importlib.import_module("torch.distributed._symmetric_memory")
    except Exception as e:  # noqa: BLE001 - any import failure is the reason
        return f"torch {torch.__version__} has no symmetric memory ({type(e).__name__}: {e})"
    missing = [a for a in ALGORITHMS if not hasattr(torch.ops.symm_mem, op_name(a))]
    if missing:
        return f"torch {torch.__version__} has no torch.ops.symm_mem.{op_name(missing[0])}"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device"
    return None


def op_name(algorithm: str) -> str:
    """The op timed: one_shot into an output of its own (no allocation per call), two_shot in place."""
    return {"one_shot": "one_shot_all_reduce_out", "two_shot": "two_shot_all_reduce_"}[algorithm]


def symm_call(torch, algorithm, buf, out, group):
    """The call of ``algorithm`` on the symmetric buffer ``buf``, and the tensor its sum lands in."""
    op = getattr(torch.ops.symm_mem, op_name(algorithm))
    if algorithm == "one_shot":
        return (lambda: op(buf, "sum", group, out)), out
    return (lambda: op(buf, "sum", group)), buf


def refusal(error: BaseException) -> str:
    """torch's reason, on one line (its messages carry a C++ stack after the first lines)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    text = lines[0] if lines else type(error).__name__
    return text[:300]


def refused_rows(reason: str, algorithms, sizes):
    return [dict(path=PATH, algorithm=a, bytes=n, refused=reason) for n in sizes for a in algorithms]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--sizes", default="", help="comma list of sizes in bytes (K, M, G suffixes); default: "
                    "the bench step's, 16 B .. 1 MiB by 4x, 64 MiB and 256 MiB")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS), help="torch's: one_shot, two_shot")
    ap.add_argument("--ours", default=",".join(OURS), help="commlib's algorithms timed in the same job on "
                    "the kernel path ('' for none)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--allow-overlap", choices=("0", "1"), default="1",
                    help=f"{OVERLAP_ENV} in the ranks (1: torch runs ranks that share a GPU)")
    ap.add_argument("--json", default="")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    args.sizes = [gpu_latency.parse_size(x) for x in args.sizes.split(",") if x] or list(SIZES)
    args.algorithms = [a for a in args.algorithms.split(",") if a]
    bad = [a for a in args.algorithms if a not in ALGORITHMS]
    if bad or not args.algorithms:
        ap.error(f"--algorithms: expected some of {', '.join(ALGORITHMS)}, got {bad or 'none'}")
    args.ours = [a for a in args.ours.split(",") if a]
    if args.np < 2 or any(n < 4 for n in args.sizes):
        ap.error("--np: at least 2 ranks; --sizes: at least one float32 (4 bytes)")
    return args


def _torch_group(comm, torch):
    """A gloo process group over the pool's ranks (its store's port from rank 0 by commlib's own
    broadcast): torch's symmetric memory exchanges its handles through it; NCCL would refuse ranks
    sharing a GPU."""
    import numpy as np
    import torch.distributed as dist
    from datetime import timedelta
    port = np.zeros(1, np.int64)
    store = None
    if comm.rank == 0:
        # (not waiting for the others here: they learn the port only from the broadcast below)
        store = dist.TCPStore("127.0.0.1", 0, comm.size, True, timedelta(seconds=60), wait_for_workers=False)
        port[0] = store.port
    comm.broadcast(port, root=0)
    if store is None:
        store = dist.TCPStore("127.0.0.1", int(port[0]), comm.size, False, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=comm.rank, world_size=comm.size, timeout=timedelta(seconds=60))
    return dist.group.WORLD.group_name


def _torch_rows(comm, torch, algorithms, sizes, reps, stream):
    """torch's rows: a symmetric buffer per size (rendezvous once), each algorithm timed on it and
    checked (ones summed over the ranks); a refusal there is the row's result."""
    import torch.distributed._symmetric_memory as symm_mem
    group = _torch_group(comm, torch)
    if hasattr(symm_mem, "enable_symm_mem_for_group"):  # needed before torch 2.8, a no-op after
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            symm_mem.enable_symm_mem_for_group(group)
    rows = []
    for n in sizes:
        try:
            buf = symm_mem.empty(n // 4, dtype=torch.float32, device=torch.device("cuda", 0))
            symm_mem.rendezvous(buf, group)
        except Exception as e:  # noqa: BLE001 - torch's refusal, alike on every rank (its checks are)
            rows += refused_rows(refusal(e), algorithms, [n])
            continue
        out = torch.empty_like(buf)
        for algo in algorithms:
            call, got = symm_call(torch, algo, buf, out, group)
            try:
                buf.fill_(1.0)
                torch.cuda.synchronize()
                comm.barrier()  # every rank's ones are in place before any reads them
                call()
                torch.cuda.synchronize()
                if not bool((got == comm.size).all()):
                    rows.append(dict(path=PATH, algorithm=algo, bytes=n, error="wrong result"))
                    continue
                comm.barrier()
                t = gpu_latency._clocks(call, stream, reps if n < (1 << 20) else max(5, reps // 4))
            except Exception as e:  # noqa: BLE001
                rows.append(dict(path=PATH, algorithm=algo, bytes=n, refused=refusal(e)))
                continue
            rows.append(dict(path=PATH, algorithm=algo, bytes=n, ran="torch", **t))
        del buf, out
    return rows


def rank_main(comm, algorithms, sizes, reps, ours, allow_overlap):
    """This rank's rows: torch's, then commlib's mapped all_reduce and the floors (gpu_latency's)."""
    import torch
    os.environ[OVERLAP_ENV] = allow_overlap  # read by torch's rendezvous when it runs
    why = unavailable(torch)
    if why:
        rows = refused_rows(why, algorithms, sizes)
    else:
        import torch.distributed as dist
        torch.cuda.set_device(0)
        stream = torch.cuda.current_stream()
        try:
            rows = _torch_rows(comm, torch, algorithms, sizes, reps, stream)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    if ours:
        rows += gpu_latency.rank_main(comm, "cuda", ours, reps, sizes, paths=("kernel",))
    return rows


def merge(per_rank):
    """gpu_latency's merge (the slowest rank's clocks), except that a row refused or wrong on any
    rank is that rank's row (torch's checks are alike on every rank, but a rank's own failure must
    not be averaged away)."""
    out = []
    for rows in zip(*per_rank):
        odd = [r for r in rows if "refused" in r or "error" in r]
        out.append(dict(odd[0]) if odd else gpu_latency.merge([[r] for r in rows])[0])
    return out


def markdown(rows, np_, mps, allow_overlap):
    """gpu_latency's table of the measured rows, then one line per refusal reason (every size it
    refused at), each saying ``refused: <torch's reason>``."""
    from commlib.perf.common import fmt_bytes
    head = (f"torch's symmetric-memory all_reduce ({OVERLAP_ENV}={allow_overlap}) beside commlib's, "
            "in the same job.")
    measured = [r for r in rows if "refused" not in r]
    table = gpu_latency.markdown(measured, np_, mps, "cuda") if measured else ""
    every = sorted({r["bytes"] for r in rows})
    by_reason = {}
    for r in rows:
        if "refused" in r:
            by_reason.setdefault((r["path"], r["algorithm"], r["refused"]), []).append(r["bytes"])
    lines = []
    for (p, a, why), sizes in by_reason.items():
        where = (f"every size ({fmt_bytes(every[0])} .. {fmt_bytes(every[-1])})" if sizes == every and len(every) > 1
                 else ", ".join(fmt_bytes(n) for n in sizes))
        lines.append(f"- {p} {a} at {where}: refused: {why}")
    return head + "\n\n" + table + ("\n" if table else "") + "".join(ln + "\n" for ln in lines)


def main(argv=None):
    args = parse_args(argv)
    import torch
    mps = bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))
    why = unavailable(torch)
    if why:  # nothing can run: say so without starting ranks (no GPU, a CPU build of torch)
        rows = refused_rows(why, args.algorithms, args.sizes)
    else:
        from commlib.testing.ranks import RankPool
        pool = RankPool(args.np, timeout=args.timeout, env={"COMMLIB_TIMEOUT": "30"})
        try:
            per_rank = pool.run(rank_main, args.algorithms, args.sizes, args.reps, args.ours, args.allow_overlap,
                                timeout=args.timeout)
        finally:
            pool.close()
        rows = merge(per_rank)
    print(markdown(rows, args.np, mps, args.allow_overlap))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"np": args.np, "mps": mps, OVERLAP_ENV: args.allow_overlap, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
