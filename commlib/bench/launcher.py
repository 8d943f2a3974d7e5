"""``commlib bench``: start the ranks, run commlib and the peers, merge, fit, tune, report.

Two ways to run:

* **local** (no RANK/WORLD_SIZE in the environment): this process is a driver
  (local_driver.py). It starts ``--np`` rank processes for commlib (``python -m
  commlib.bench.launcher --backend commlib``, rendezvous through ``commlib.init`` on a free port),
  then ``--np`` processes for gloo (torch.distributed), then one ``mpirun -np N python -m
  commlib.bench.launcher --backend mpi`` job, each writing its records to a JSON part that the
  driver merges with a one-thread memcpy measurement. Rank 0 of each job prints its table as it runs.
* **inside a launcher** (torchrun, srun, mpirun: RANK/WORLD_SIZE, SLURM_* or OMPI_* set): this
  process is one rank (under_launcher.py); it runs commlib, then gloo, then MPI when started by
  mpirun, and rank 0 writes the JSON.

The pieces: arguments.py (the command line and the run's config), rank_process.py (one rank of
one backend; the entry of ``python -m commlib.bench.launcher``), local_driver.py,
under_launcher.py, run_results.py (the JSON document, its schema, tuning, summary and report).
"""
from __future__ import annotations

import shlex
import sys

from commlib.bench.arguments import add_arguments, config_from_args  # noqa: F401 (commlib.cli, tests)
from commlib.bench.hosts import Placement
from commlib.bench.local_driver import merge_passes, run_local  # noqa: F401 (tests)
from commlib.bench.rank_process import import_plugins, run_backend, worker_main  # noqa: F401 (tests)
from commlib.bench.run_results import SCHEMA, TIMING_NOTE  # noqa: F401 (the names it always had)
from commlib.bench.under_launcher import external_launch, run_inside


def run(a) -> int:
    """``commlib bench`` with parsed arguments ``a``: inside a launcher, or as the local driver."""
    cfg = config_from_args(a)
    command = "commlib bench " + " ".join(shlex.quote(x) for x in sys.argv[2:]) \
        if len(sys.argv) > 1 and sys.argv[1] == "bench" else "commlib bench"
    if external_launch():
        return run_inside(a, cfg, command)
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
        return run_local(a, cfg, command, Placement(P, a.hosts))
    from commlib.testing.netns import Namespaces, NetnsUnavailable
    try:
        with Namespaces(a.hosts, rate=a.rate) as net:
            return run_local(a, cfg, command, Placement(P, a.hosts, net, a.rate))
    except NetnsUnavailable as e:
        raise SystemExit(f"commlib bench: --netns: {e}") from None


if __name__ == "__main__":
    sys.exit(worker_main())
