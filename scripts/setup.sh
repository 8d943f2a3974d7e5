#!/usr/bin/env bash
# Creates .venv (once per requirements change) and builds commlib._C (and commlib._C_cuda when
# nvcc is found) in place. Safe to run repeatedly: unchanged objects are not recompiled.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ] || ! cmp -s requirements.txt .venv/.requirements; then
  echo "[setup] creating .venv and installing requirements.txt" >&2
  rm -rf .venv
  "$PY" -m venv .venv
  .venv/bin/pip install -q --upgrade pip >/dev/null 2>&1 || true
  # (pip's notes about this machine's extra index locations are noise: filtered out)
  .venv/bin/pip install -q -r requirements.txt 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
  cp requirements.txt .venv/.requirements
fi
echo "[setup] building the extension" >&2
.venv/bin/python setup.py -q build_ext --inplace >build.log 2>&1 || { cat build.log >&2; exit 1; }
# Editable install for the `commlib` command; the build above already produced the modules.
if [ ! -x .venv/bin/commlib ]; then
  .venv/bin/pip install -q --no-build-isolation --no-deps -e . >>build.log 2>&1 || { cat build.log >&2; exit 1; }
fi
