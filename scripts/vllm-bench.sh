#!/usr/bin/env bash
# The vLLM benchmark (scripts/vllm-bench.py; docs/vllm.md, "Benchmark"): installs this checkout's
# wheel (scripts/wheel.sh) into the benchmark's venv and runs real engines on a shared-prefix workload, PeerCache beside
# vLLM's own options and the peers' connectors (Mooncake Store, LMCache: installed in a venv
# layered on the vLLM one, scripts/vllm-peers-venv.sh). Arguments go to the script (--json, --md…).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prereqs.sh
need_rdma_build_tools "the Python wheel"
source scripts/wheel.sh
source scripts/vllm-peers-venv.sh
install_peercache_wheel
VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}" exec python scripts/vllm-bench.py "$@"
