#!/usr/bin/env bash
# The README's first command: set-up, then the default sweep (every collective and algorithm on 4
# local ranks, 8 B - 16 MiB, against gloo, MPI and memcpy) and the report in report/.
# Extra arguments go to `commlib bench` (e.g. --np 8).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Without MPI the sweep still runs; the report then says "MPI: not available".
scripts/install_mpi.sh || true
mkdir -p report
.venv/bin/commlib bench all_reduce all_gather reduce_scatter all_to_all broadcast \
  --np 4 -b 8 -e 16M -f 4 --peers gloo,mpi --json report/bench.json "$@"
.venv/bin/commlib report report/bench.json -o report/
echo "report: $(pwd)/report/index.html"
