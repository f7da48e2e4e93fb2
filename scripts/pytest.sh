#!/usr/bin/env bash
# Builds the Python wheel into the cached venv and runs the fast Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prereqs.sh
need_rdma_build_tools "the Python wheel"
source scripts/venv.sh
maturin develop --release -q -m peercache-py/Cargo.toml
pytest -q peercache-py/tests "$@"
