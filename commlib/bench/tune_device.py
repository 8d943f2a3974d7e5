"""``commlib tune --device emulated|cuda``: measure the device's paths now, then write the tuning
file's device half (commlib/bench/device_tuning.py) through ``commlib bench --tune``."""
from __future__ import annotations

import argparse


def run_tune(args) -> int:
    """``commlib tune --device D [-o OUT] [-- BENCH ARGUMENTS]``: a device bench of the kernel and
    copy paths (``commlib bench ... --device D --paths kernel,copy --peers none --tune``) that writes
    the tuning file's kernel_path rows and device_path crossovers, keeping its host rows."""
    from commlib.bench.launcher import add_arguments, run
    bench = list(args.files or ["all_reduce"])
    if "--paths" not in bench:
        bench += ["--paths", "kernel,copy"]
    if "--peers" not in bench:
        bench += ["--peers", "none"]
    bench += ["--device", args.device, "--tune", "--tune-file", args.output or "tuning.json"]
    p = argparse.ArgumentParser(prog="commlib tune --device")
    add_arguments(p)
    return run(p.parse_args(bench))
