#!/usr/bin/env bash
# The README's test command: set-up (own venv, build), then the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -q -ra "$@"
