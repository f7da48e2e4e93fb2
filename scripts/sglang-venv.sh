#!/usr/bin/env bash
# Sourced by scripts/sglang-contract.sh: creates (once) the cached venv with the real SGLang
# (CPU-only use: PyPI's torch runs without a GPU) plus maturin and pytest, and exports
# VIRTUAL_ENV and PATH for it. About 6 GB; the first build takes 5–10 minutes (downloads), later
# runs reuse it. Keyed by every pinned version, outside the clone. Recipe and rationale:
# docs/sglang.md ("The contract test").
SGLANG_VERSION=0.5.23
TORCH_VERSION=2.14.1
RECIPE=2   # bump when the package list below changes
MATURIN_VERSION=1.16.0
PYTEST_VERSION=9.2.0
CACHE_DIR="${PEERCACHE_CI_CACHE:-$HOME/.cache/peercache-ci}"
PY="${PYTHON:-python3}"
PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
SGVENV="$CACHE_DIR/sglang-venv-r$RECIPE-py$PYVER-sglang$SGLANG_VERSION-torch$TORCH_VERSION-maturin$MATURIN_VERSION-pytest$PYTEST_VERSION"
if [ ! -f "$SGVENV/.complete" ]; then
  rm -rf "$SGVENV"
  mkdir -p "$CACHE_DIR"
  "$PY" -m venv "$SGVENV"
  pipi() { "$SGVENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir "$@"; }
  pipi "maturin==$MATURIN_VERSION" "pytest==$PYTEST_VERSION"
  # What `import sglang.srt.mem_cache.{hicache_storage,memory_pool_host,storage.backend_factory}`
  # needs. sglang itself without its dependencies: they pin CUDA-only stacks.
  # Versions sglang pins are pinned the same here.
  pipi "torch==$TORCH_VERSION" "torchvision==0.29.2" numpy orjson psutil pybase64 requests \
    packaging pillow starlette msgspec pydantic pyzmq tqdm ipython aiohttp dill xxhash zstandard \
    "transformers==5.19.0" "tokenizers==0.23.2" "sentencepiece==0.2.1" \
    "compressed-tensors==0.18.0" "apache-tvm-ffi==0.1.11" gguf ninja
  pipi --no-deps "sglang==$SGLANG_VERSION"
  touch "$SGVENV/.complete"
fi
export VIRTUAL_ENV="$SGVENV"
export PATH="$SGVENV/bin:$PATH"
