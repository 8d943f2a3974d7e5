#!/usr/bin/env bash
# The README's test command: set-up (own venv, build), then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# --durations: the slowest tests, to keep an eye on the CI budget (15 minutes on 2 cores).
exec .venv/bin/python -m pytest -q -ra --durations=15 "$@"
