#!/usr/bin/env bash
# The type-check stage: mypy over the Python package (its modules and the extension's .pyi)
# in a small cached venv; engine imports (torch, vllm, sglang) are not followed, so the
# package's own Protocols carry the engine types ([tool.mypy] in peercache-py/pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
MYPY_VERSION=1.19.1
NUMPY_VERSION=2.4.6
CACHE_DIR="${PEERCACHE_CI_CACHE:-$HOME/.cache/peercache-ci}"
PY="${PYTHON:-python3}"
PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
TVENV="$CACHE_DIR/mypy-venv-py$PYVER-mypy$MYPY_VERSION-numpy$NUMPY_VERSION"
if [ ! -x "$TVENV/bin/mypy" ]; then
  rm -rf "$TVENV"
  mkdir -p "$CACHE_DIR"
  "$PY" -m venv "$TVENV"
  "$TVENV/bin/pip" install -q --disable-pip-version-check "mypy==$MYPY_VERSION" "numpy==$NUMPY_VERSION"
fi
cd peercache-py
"$TVENV/bin/mypy" --config-file pyproject.toml python/peercache
# The GPU check's scripts (run by the sglang stage and on GPU hosts), on the Python they run with.
MYPYPATH=python "$TVENV/bin/mypy" --config-file pyproject.toml --python-version 3.11 \
  ../scripts/gpu_wheels.py ../scripts/gpu_check.py ../scripts/gpu_rehearse_imports.py \
  ../scripts/gpu-shims/sgl_kernel/__init__.py
