#!/usr/bin/env bash
# Optional peer for the benchmark: OpenMPI from Debian and mpi4py from PyPI. Exits non-zero (and
# the benchmark reports "MPI: not available") where they cannot be installed.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v mpirun >/dev/null 2>&1 || [ ! -e /usr/include/x86_64-linux-gnu/openmpi ] && [ ! -e /usr/lib/x86_64-linux-gnu/openmpi/include ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[mpi] installing OpenMPI (apt-get)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin libopenmpi-dev) >/dev/null 2>&1 \
      || { echo "[mpi] apt-get could not install OpenMPI" >&2; exit 1; }
  else
    echo "[mpi] mpirun not found and not root: skipping the MPI peer" >&2
    exit 1
  fi
fi
.venv/bin/python -c "import mpi4py" 2>/dev/null && exit 0
echo "[mpi] installing mpi4py" >&2
.venv/bin/pip install -q mpi4py >/dev/null 2>&1 || { echo "[mpi] pip could not build mpi4py" >&2; exit 1; }
