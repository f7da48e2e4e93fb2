#!/usr/bin/env bash
# The direct-linker tests (peercache-py/tests/sglang/test_linker.py) on a CUDA device: SGLang's
# device KV pools in GPU memory, so every load and offload takes the staged path (pinned host
# arena, per-layer copies on a side stream) that CPU runs exercise with linker_staging=always.
# Without a CUDA device it prints one line and exits 0. Same cached venv as sglang-contract.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "sglang-linker-gpu: skipped: no CUDA device here (nvidia-smi lists none); run it on a GPU host"
  exit 0
fi
source scripts/sglang-venv.sh
if ! python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "sglang-linker-gpu: skipped: nvidia-smi sees a GPU but this venv's torch has no CUDA"
  exit 0
fi
maturin develop --release -q -m peercache-py/Cargo.toml
PEERCACHE_LINKER_DEVICE=cuda pytest -q -p no:cacheprovider peercache-py/tests/sglang/test_linker.py "$@"
