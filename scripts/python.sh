#!/usr/bin/env bash
# Runs Python with the `peercache` package built from this checkout: creates the cached venv
# once (scripts/venv.sh), builds the wheel into it (incremental after the first time), then
# runs `python ARGS…` in it. The one way the docs and the examples run Python:
#   bash scripts/python.sh examples/python_roundtrip.py
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prereqs.sh
need_rdma_build_tools "the Python wheel"
source scripts/venv.sh
maturin develop --release -q -m peercache-py/Cargo.toml
exec python "$@"
