"""The ``commlib`` command: ``commlib bench`` (sweeps, peers, model, tuning), ``commlib report``,
``commlib store`` (the rendezvous store as its own process) and ``commlib explain`` (the schedule
explorer).

    commlib bench all_reduce --np 4 -b 8 -e 64M -f 4 --algorithms ring,rabenseifner,auto \
        --peers gloo,mpi --json out.json
    commlib report out.json [more.json ...] -o report/
    commlib tune run1.json run2.json [...]          # auto's tuning file from several runs
    commlib tune --device emulated -- all_reduce --np 2 -b 4K -e 4M   # + the device's kernel_path rows
    commlib sim all_reduce --topology dgx-h100 --nodes 1,8,64   # predictions (commlib/sim)
    commlib tune --sim dgx-h100 --nodes 1,8,64 -o tuning.json   # auto's tuning file from predictions
    commlib store --host 10.0.0.1 --port 29500      # a store that outlives every rank (COMMLIB_STORE)
    commlib explain all_reduce ring --size 4 --count 8 -o explain/   # the schedule explorer page

``python -m commlib`` is the same command.
"""
from __future__ import annotations

import argparse
import sys


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="commlib", description="commlib benchmarks, reports, the rendezvous store and "
                                                            "the schedule explorer")
    sub = p.add_subparsers(dest="command", metavar="{bench,bench-torch,report,tune,sim,store,explain}")
    sub.required = True
    from commlib.bench.launcher import add_arguments
    b = sub.add_parser("bench", help="run collectives on local ranks (or inside torchrun/srun), "
                                     "against gloo, MPI and memcpy; nccl-tests table + JSON")
    add_arguments(b)
    r = sub.add_parser("report", help="HTML + Markdown report with plots from bench JSON files")
    r.add_argument("files", nargs="+", metavar="JSON", help="files written by commlib bench --json")
    r.add_argument("-o", "--output", default="report", help="output directory (default report/)")
    t = sub.add_parser("tune", help="write auto's tuning file from one or more bench JSON files "
                                    "(an algorithm's time at a size: median over the runs)")
    t.add_argument("files", nargs="*", metavar="JSON", help="files written by commlib bench --json (with "
                                                             "--device: commlib bench arguments, after --)")
    t.add_argument("--device", choices=("emulated", "cuda"),
                   help="measure the device's kernel and copy paths now (a commlib bench run with --paths "
                        "kernel,copy) and write the kernel_path rows and device_path crossovers")
    t.add_argument("-o", "--output", help="tuning file to write (default: ./tuning.json; the package's "
                                          "own file, commlib/core/tuning.json, only when named)")
    t.add_argument("--single-copy-only", action="store_true",
                   help="take only the single_copy section from these runs (commlib bench --single-copy-ab) "
                        "and keep the output file's algorithm rows as they are")
    t.add_argument("--machine-section", action="store_true",
                   help="write the measured entries as the output file's section for the runs' machine class "
                        "(its CPU model and cores; replaces that machine's section, keeps everything else): "
                        "how commlib/core/tuning.json carries tables of several machine classes")
    from commlib.sim.tune import add_arguments as add_sim_tune
    add_sim_tune(t)
    from commlib.sim.cli import add_arguments as add_sim
    s = sub.add_parser("sim", help="predict collectives on a modelled cluster (presets, topology JSON, "
                                   "or fitted from a bench run): nccl-tests table + JSON")
    add_sim(s)
    from commlib.explain.cli import add_arguments as add_explain
    e = sub.add_parser("explain", help="the schedule explorer: one self-contained page showing every step's "
                                       "messages, what each rank holds (verifier) and step times (simulator)")
    add_explain(e)
    from commlib.bench.torch_overhead import add_arguments as add_torch_overhead
    bt = sub.add_parser("bench-torch", help="per-call cost of blocking dist.* collectives over commlib vs "
                                            "gloo, torch's do-nothing backends and comm.* (8 B..64 KiB)")
    add_torch_overhead(bt)
    from commlib.bootstrap.store_command import add_arguments as add_store
    st = sub.add_parser("store", help="serve the rendezvous store as its own process, so that it outlives every "
                                      "rank (the ranks set COMMLIB_STORE=host:port); stops on SIGTERM/SIGINT")
    add_store(st)
    return p


def explorer_pages(compared, outdir):
    """The report's schedule-explorer pages (commlib/explain/report.py), handed to bench's report
    here: the explorer reads the simulator, which bench never imports."""
    from commlib.explain.report import write_pages
    return write_pages(compared, outdir)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    args.explorer = explorer_pages  # the report's "See the algorithms move" (bench and report)
    if args.command == "bench":
        from commlib.bench.launcher import run
        return run(args)
    if args.command == "bench-torch":
        from commlib.bench.torch_overhead import run as torch_overhead_run
        return torch_overhead_run(args)
    if args.command == "store":
        from commlib.bootstrap.store_command import run as store_run
        return store_run(args)
    if args.command == "sim":
        from commlib.sim.cli import run as sim_run
        return sim_run(args)
    if args.command == "explain":
        from commlib.explain.cli import run as explain_run
        try:
            return explain_run(args)
        except ValueError as e:
            parser().error(f"explain: {e}")
    if args.command == "tune" and args.sim:
        from commlib.sim.tune import main as sim_tune_main
        return sim_tune_main(args)
    if args.command == "tune" and args.device:
        from commlib.bench.tune_device import run_tune
        return run_tune(args)
    if args.command == "tune":
        if not args.files:
            parser().error("tune: give bench JSON files, or --sim TOPOLOGY")
        from commlib.bench.tuning import main as tune_main
        return tune_main(args)
    from commlib.bench.report import main as report_main
    return report_main(args)


if __name__ == "__main__":
    sys.exit(main())
