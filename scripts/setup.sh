#!/usr/bin/env bash
# Creates .venv (once per requirements change) and builds commlib._C (and commlib._C_cuda when
# nvcc is found) in place. Safe to run repeatedly: unchanged objects are not recompiled.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Where no GPU is listed, no GPU runs the CUDA module built here: its kernels' PTX is compiled once and
# assembled for each architecture, each still checked for register spills (COMMLIB_CUDA_ONE_PTX,
# setup.py): about 40% less nvcc CPU, of a module that was 744 of the 3090 compile-seconds of the
# whole build on a fresh 2-core machine (session 37). With a GPU listed, each architecture's own PTX,
# and the newest's kept for newer GPUs; `COMMLIB_CUDA_ONE_PTX= scripts/setup.sh` builds that way
# anywhere.
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }; then
  export COMMLIB_CUDA_ONE_PTX=${COMMLIB_CUDA_ONE_PTX-1}
fi
if [ ! -x .venv/bin/python ] || ! cmp -s requirements.txt .venv/.requirements; then
  echo "[setup] creating .venv and installing requirements.txt" >&2
  rm -rf .venv
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
  # The build's own requirements first (pybind11, setuptools, wheel: seconds), then the core's and the
  # CUDA module's compile starts while pip installs the rest: unpacking and byte-compiling torch is
  # about 30 s of one core, the other idle. The build below joins this one (an object one build is
  # compiling, the other waits for: build_deps.object_lock) and adds the torch backend, whose flags
  # need torch installed; it decides what is built, this one only starts early.
  # (pip's notes about this machine's extra index locations are noise: filtered out)
  build_reqs=$(sed -n 's/#.*//; /^\(pybind11\|setuptools\|wheel\)\b/p' requirements.txt)
  .venv/bin/pip install -q $build_reqs 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
  # (both builds append to build.log, O_APPEND: opened with `>`, the early one wrote at its own
  # offset, over the lines the whole build had appended)
  : >build.log
  COMMLIB_NO_TORCH_BACKEND=1 .venv/bin/python setup.py -q build_ext --inplace >>build.log 2>&1 </dev/null &
  early_build=$!
  .venv/bin/pip install -q -r requirements.txt 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
  cp requirements.txt .venv/.requirements
fi
# The schedule explorer's browser test (tests/explain) drives Debian's headless chromium. Install it
# in the background while the extension builds (~25 s of apt-get, overlapped with the build and
# the tests before it; the test waits for it, bounded, or skips saying why), only where that can
# work: as root with apt-get, chromium absent, COMMLIB_NO_CHROMIUM unset.
if [ -z "${COMMLIB_NO_CHROMIUM:-}" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    && ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; } \
    && [ -z "$(find build/chromium.installing -mmin -6 2>/dev/null)" ]; then  # none under way (<6 min)
  mkdir -p build
  : >build/chromium.installing
  echo "[setup] installing chromium in the background (log: build/chromium.log)" >&2
  (
    pkgs="chromium chromium-driver"
    export DEBIAN_FRONTEND=noninteractive
    # The package lists may be missing on a fresh machine: update only when the install needs it.
    timeout 300 sh -c "apt-get install -y -q $pkgs || { apt-get update -q && apt-get install -y -q $pkgs; }" \
      >build/chromium.log 2>&1
    rm -f build/chromium.installing
  ) </dev/null >/dev/null 2>&1 &
fi
echo "[setup] building the extension" >&2
if [ -n "${early_build:-}" ]; then
  # (its failures are this build's to report: it compiles again whatever the early one did not)
  .venv/bin/python setup.py -q build_ext --inplace >>build.log 2>&1 \
    || { kill "$early_build" 2>/dev/null; wait "$early_build" 2>/dev/null; cat build.log >&2; exit 1; }
  wait "$early_build" || true
else
  .venv/bin/python setup.py -q build_ext --inplace >build.log 2>&1 || { cat build.log >&2; exit 1; }
fi
# Editable install for the `commlib` command; the build above already produced the modules.
if [ ! -x .venv/bin/commlib ]; then
  .venv/bin/pip install -q --no-build-isolation --no-deps -e . >>build.log 2>&1 || { cat build.log >&2; exit 1; }
fi
