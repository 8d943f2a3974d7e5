#!/usr/bin/env bash
# The README's test command: set-up (own venv, build), then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Two pytest workers (pytest-xdist), one per core of the 2-core machines this runs on: much of the
# suite is one thread (the simulator, the verifier, imports, a test waiting on ranks that sleep),
# so one worker's tests fill the core the other's leave idle. --dist loadfile keeps each module in
# one worker (its fixtures, e.g. the torch suite's one run, are made once); each worker has its
# own rank pools. One report: one progress line, one --durations list, one summary, one exit
# status. `scripts/test.sh -n 0 ...` runs in one process, and so does a machine with a GPU listed:
# the GPU tests' jobs agree on the device's resident blocks among their own ranks only
# (stream/kernel_occupancy.cc), so two workers' jobs must not share the GPU.
workers=2
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then workers=0; fi
# --durations: the slowest tests, to keep an eye on the CI budget (15 minutes on 2 cores).
exec .venv/bin/python -m pytest -q -ra --durations=15 -n "$workers" --dist loadfile "$@"
