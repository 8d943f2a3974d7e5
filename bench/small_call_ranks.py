"""Per-rank view of one call (an 8-byte broadcast or a barrier by default; any size of broadcast or
all_to_all with --bytes) timed exactly as the sweep times it (commlib/bench/sweep.py: ``fn()`` between
two ``perf_counter`` reads, back to back), for commlib and Open MPI, so the bench's median of the
slowest rank's time per call can be taken apart: each rank's median and 10th/90th percentiles (the
software cost of a call that does not wait, and how often calls wait), the loop average (total time
/ calls: the throughput), each rank's context switches per call (sleeps on a futex, and switches out
by preemption or a yield that gave the core), where the ranks ran (each one's core at the end, and
its moves between cores during the loop), and each rank's time per call on a core and runnable but
waiting for one (/proc/self/schedstat: CPU time stays steady when other processes load the machine,
wall time does not).

    python bench/small_call_ranks.py broadcast --np 4 --calls 3000     # commlib, then MPI
    python bench/small_call_ranks.py barrier --backends commlib
    python bench/small_call_ranks.py barrier --pin      # each rank bound to one core, spread
    python bench/small_call_ranks.py barrier --cores 0,1,1,1    # one rank alone, three on a core
    COMMLIB_CMA=1 python bench/small_call_ranks.py all_to_all --bytes 16777216 --calls 20 --reps 2 \
        --algorithm direct      # 16 MiB all_to_all, single-copy reads forced on

docs/transports.md "Flag calls" and "Single-copy reads" quote it. A rank process runs ``--rank-main``.
"""
from __future__ import annotations

import argparse
import functools
import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from commlib.bootstrap.ports import free_port  # noqa: E402


def context_switches():
    """(voluntary, involuntary) context switches of this process so far: a voluntary one is a
    sleep (FUTEX_WAIT), an involuntary one a preemption or a sched_yield that gave the core away."""
    with open("/proc/self/status") as f:
        got = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
    return float(got["voluntary_ctxt_switches"]), float(got["nonvoluntary_ctxt_switches"])


def placement():
    """(the core this process last ran on, its migrations between cores so far) from /proc."""
    with open("/proc/self/stat") as f:
        cpu = float(f.read().rsplit(")", 1)[1].split()[36])  # field 39; the name may hold spaces
    with open("/proc/self/sched") as f:
        moves = next((float(line.split(":")[1]) for line in f if line.startswith("se.nr_migrations")), -1.0)
    return cpu, moves


def schedstat():
    """(seconds on a core, seconds runnable but waiting for one) of this process so far, from
    /proc/self/schedstat: CPU time is steadier than wall time on a loaded machine, and the wait
    says how long a rank was ready to run while other processes held the cores."""
    with open("/proc/self/schedstat") as f:
        run_ns, wait_ns, _slices = f.read().split()
    return float(run_ns) * 1e-9, float(wait_ns) * 1e-9


def rusage():
    """(user seconds, system seconds, minor page faults) of this process so far (getrusage): the
    system part is where the kernel copies (process_vm_readv) and sleeps/wakes (futex) are paid."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime, float(ru.ru_minflt)


# Syscalls counted per rank over the timed loop with --syscalls (perf's tracepoints: load-independent
# counts, unlike times): every syscall, then the ones that matter for a large all_to_all.
SYSCALL_EVENTS = ("raw_syscalls:sys_enter", "syscalls:sys_enter_futex", "syscalls:sys_enter_sched_yield",
                  "syscalls:sys_enter_process_vm_readv", "syscalls:sys_enter_poll",
                  "syscalls:sys_enter_epoll_wait")


class SyscallCounter:
    """``perf stat`` attached to this process for the timed loop (needs perf and tracepoint access:
    root, or perf_event_paranoid <= 1); ``stop()`` returns one count per SYSCALL_EVENTS, NaN where
    perf could not count it."""

    def __init__(self):
        self.proc = subprocess.Popen(["perf", "stat", "-x", ",", "-e", ",".join(SYSCALL_EVENTS),
                                      "-p", str(os.getpid())], stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)  # attached before the loop starts

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=30)
        counts = {}
        for line in err.splitlines():
            f = line.split(",")
            if len(f) > 2 and f[2] in SYSCALL_EVENTS:
                counts[f[2]] = float(f[0]) if f[0].replace(".", "").isdigit() else float("nan")
        return [counts.get(e, float("nan")) for e in SYSCALL_EVENTS]


def aligned_empty(n, dtype=np.float32):
    """``n`` elements on whole 2 MiB pages: the start 2 MiB-aligned and MADV_HUGEPAGE (what the
    core does for its own scratch, csrc/host/lowering.cc), unlike NumPy's buffers, which start 16
    bytes past a page and so have their first and last blocks partly on 4 KiB pages."""
    import mmap
    huge = 2 << 20
    nbytes = n * np.dtype(dtype).itemsize
    m = mmap.mmap(-1, nbytes + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = np.frombuffer(m, np.uint8)
    skip = -base.ctypes.data % huge
    if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    return base[skip:skip + nbytes].view(dtype)


def huge_share(arr):
    """The share of ``arr``'s bytes on 2 MiB pages (commlib/bench/huge_pages.py)."""
    from commlib.bench.huge_pages import huge_share as share
    return share(arr.ctypes.data, arr.nbytes)


def make_call(b, backend, coll, nbytes, algorithm, in_place=False, aligned=False):
    """The timed call: ``coll`` on float32 buffers of ``nbytes`` per rank (all_to_all: the whole
    send buffer, as the sweep counts it; all_gather: the whole output, as the sweep counts it;
    ``in_place``: the output is the input), commlib with ``algorithm``; ``aligned``: the buffers
    on whole 2 MiB pages (aligned_empty) instead of the bench's (fresh_empty)."""
    whole = b.size if coll in ("all_to_all", "all_gather") else 1
    n = max(nbytes // 4, whole)
    n -= n % whole
    from commlib.perf.fresh_buffers import fresh_empty
    alloc = aligned_empty if aligned else (lambda k: fresh_empty(k, np.float32))
    if coll == "all_gather":
        out = alloc(n)
        out[:] = 1
        buf = out[b.rank * (n // whole):(b.rank + 1) * (n // whole)] if in_place else alloc(n // whole)
        buf[:] = 1
        if backend == "mpi":
            return functools.partial(b.comm.Allgather, b.MPI.IN_PLACE if in_place else buf, out)
        return functools.partial(b.comm.all_gather, out, buf, algorithm)
    buf = alloc(n)
    buf[:] = 1
    out = buf if in_place else alloc(n)
    if backend == "mpi":
        send = b.MPI.IN_PLACE if in_place else buf
        return {"broadcast": functools.partial(b.comm.Bcast, buf, 0), "barrier": b.comm.Barrier,
                "all_to_all": functools.partial(b.comm.Alltoall, send, out)}[coll]
    return {"broadcast": functools.partial(b.comm.broadcast, buf, 0, algorithm),
            "barrier": functools.partial(b.comm.barrier, False, algorithm),  # (positional: no kwargs dict a call)
            "all_to_all": functools.partial(b.comm.all_to_all, out, buf, algorithm)}[coll]


def rank_main(backend, coll, calls, reps, pin=False, nbytes=8, algorithm="auto", syscalls=False, in_place=False,
              aligned=False, cores=""):
    from commlib.bench.rank_process import _make_backend
    b = _make_backend(backend)
    if cores:  # rank r on the r-th core of the list: a placement the scheduler may or may not choose
        os.sched_setaffinity(0, {int(cores.split(",")[b.rank])})
    elif pin:  # rank r on the (r * cores / ranks)-th core of this process's set, for either library
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[b.rank * len(cpus) // b.size]})
    # several commlib algorithms (comma-separated) take turns within each rep: an A/B in one process
    algos = algorithm.split(",") if backend == "commlib" else [algorithm]
    fns = {a: make_call(b, backend, coll, nbytes, a, in_place, aligned) for a in algos}
    if coll in ("all_to_all", "all_gather"):
        bufs = [x for x in next(iter(fns.values())).args if isinstance(x, np.ndarray)]
        shares = b.gather_stats(np.array([huge_share(x) for x in bufs[:2]], np.float64))
    if b.rank == 0 and coll in ("all_to_all", "all_gather"):
        print(f"{backend}: share of the buffers' mappings on 2 MiB pages per rank (first two buffers of the call): "
              + " ".join("/".join(f"{v:.2f}" for v in row) for row in shares), flush=True)
    pc = time.perf_counter
    for rep, algo in ((r, a) for r in range(reps) for a in algos):
        fn = fns[algo]
        for _ in range(min(200, calls)):
            fn()
        b.barrier()
        ts = [0.0] * calls
        sw0 = context_switches()
        sched0 = schedstat()
        moves0 = placement()[1]
        ru0 = rusage()
        counter = SyscallCounter() if syscalls else None
        b.barrier()
        t_loop = pc()
        for j in range(calls):
            t0 = pc()
            fn()
            ts[j] = pc() - t0
        loop = pc() - t_loop
        nsys = [x / calls for x in counter.stop()] if counter else []
        ru = [(b_ - a_) / calls for a_, b_ in zip(ru0, rusage())]
        sw = [(b_ - a_) / calls for a_, b_ in zip(sw0, context_switches())]
        sched = [(b_ - a_) / calls * 1e6 for a_, b_ in zip(sched0, schedstat())]
        cpu, moves = placement()
        st = b.gather_stats(np.array(ts + [loop] + sw + [cpu, moves - moves0] + sched + ru + nsys, np.float64))
        if b.rank == 0:
            per = st[:, :calls] * 1e6
            us = lambda xs: "/".join(f"{x:.2f}" for x in xs)  # noqa: E731
            print(f"{backend}{'' if backend == 'mpi' else ' ' + algo} {coll} rep {rep}: median of the slowest rank per call "
                  f"{np.median(per.max(axis=0)):.2f} us; per rank: median {us(np.median(per, axis=1))}, "
                  f"p10 {us(np.percentile(per, 10, axis=1))}, p90 {us(np.percentile(per, 90, axis=1))}; "
                  f"loop average {st[:, calls].max() / calls * 1e6:.2f} us; per call: sleeps "
                  f"{us(st[:, calls + 1])}, switched out {us(st[:, calls + 2])}; each rank's core at the end "
                  f"{'/'.join(str(int(c)) for c in st[:, calls + 3])}, moves between cores "
                  f"{'/'.join(str(int(c)) for c in st[:, calls + 4])}; per call: on a core {us(st[:, calls + 5])} us, "
                  f"runnable but waiting {us(st[:, calls + 6])} us; user {us(st[:, calls + 7] * 1e6)} us, "
                  f"system {us(st[:, calls + 8] * 1e6)} us, minor faults {us(st[:, calls + 9])}", flush=True)
            for k, e in enumerate(SYSCALL_EVENTS if syscalls else ()):
                print(f"  per call, {e.split(':')[1]}: {us(st[:, calls + 10 + k])}", flush=True)
    close = getattr(b.comm, "close", None)
    if backend == "commlib" and close:
        close()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("collective", choices=("broadcast", "barrier", "all_to_all", "all_gather"))
    p.add_argument("--bytes", type=int, default=8, help="bytes per rank (default 8; all_to_all: the whole send buffer; all_gather: the whole output)")
    p.add_argument("--algorithm", default="auto",
                   help="commlib's algorithm (default auto); several, comma-separated, take turns in each rep")
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--backends", default="commlib,mpi")
    p.add_argument("--pin", action="store_true",
                   help="bind each rank to one core, spread evenly (separates the wait from where the "
                        "scheduler puts the ranks: unpinned, all four may share one core)")
    p.add_argument("--cores", default="",
                   help="bind rank r to the r-th core of this comma list (e.g. 0,1,1,1: one rank alone on a "
                        "core, three sharing the other, a placement the scheduler keeps for whole runs)")
    p.add_argument("--syscalls", action="store_true",
                   help="count each rank's syscalls in the timed loop (perf stat tracepoints; root)")
    p.add_argument("--in-place", action="store_true", help="all_to_all, all_gather: the output is the input")
    p.add_argument("--aligned", action="store_true",
                   help="all_to_all, all_gather: every buffer on whole 2 MiB pages (not NumPy's allocation)")
    p.add_argument("--rank-main", metavar="BACKEND", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.rank_main:
        return rank_main(a.rank_main, a.collective, a.calls, a.reps, a.pin, a.bytes, a.algorithm, a.syscalls,
                         a.in_place, a.aligned, a.cores)
    os.system("uptime")
    me = [sys.executable, os.path.abspath(__file__), a.collective, "--calls", str(a.calls), "--reps", str(a.reps),
          "--bytes", str(a.bytes), "--algorithm", a.algorithm]
    me += ["--pin"] if a.pin else []
    me += ["--cores", a.cores] if a.cores else []
    me += ["--syscalls"] if a.syscalls else []
    me += ["--in-place"] if a.in_place else []
    me += ["--aligned"] if a.aligned else []
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    for backend in a.backends.split(","):
        if backend == "mpi":
            from commlib.bench import mpi_peer
            ok, where = mpi_peer.available()
            if not ok:
                print(f"mpi: not available ({where})")
                continue
            cmd = mpi_peer.mpirun_command(where, a.np, [])
            cmd = cmd[:cmd.index(sys.executable)] + me + ["--rank-main", "mpi"]
            subprocess.run(cmd, env=env, check=True)
            continue
        port = free_port()  # below the ephemeral range: never handed to another bind(0)
        procs = [subprocess.Popen(me + ["--rank-main", "commlib"], env=dict(
            env, RANK=str(r), WORLD_SIZE=str(a.np), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(a.np),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))) for r in range(a.np)]
        if any(pr.wait(timeout=600) for pr in procs):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
