#!/usr/bin/env bash
# Builds the Python wheel into the cached venv and runs the fast Python tests
# (scripts/python.sh does the build; pytest runs in that venv).
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash scripts/python.sh -m pytest -q peercache-py/tests "$@"
