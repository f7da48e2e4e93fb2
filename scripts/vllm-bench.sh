#!/usr/bin/env bash
# The vLLM benchmark (scripts/vllm-bench.py; docs/vllm.md, "Benchmark"): builds the wheel into
# the cached vLLM venv and runs real engines on a shared-prefix workload, PeerCache beside
# vLLM's own options and the peers' connectors. Arguments go to the script (--json, --md…).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prereqs.sh
need_rdma_build_tools "the Python wheel"
source scripts/vllm-venv.sh
maturin develop --release -q -m peercache-py/Cargo.toml
VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}" exec python scripts/vllm-bench.py "$@"
