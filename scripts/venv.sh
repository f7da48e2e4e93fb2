#!/usr/bin/env bash
# Sourced by the Python scripts: creates (once) the cached venv with the pinned build and test
# tools, and exports VIRTUAL_ENV and PATH for it. The venv lives outside the clone.
MATURIN_VERSION=1.16.0
PYTEST_VERSION=9.2.0
NUMPY_VERSION=2.4.6
CACHE_DIR="${PEERCACHE_CI_CACHE:-$HOME/.cache/peercache-ci}"
PY="${PYTHON:-python3}"
PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
VENV="$CACHE_DIR/venv-py$PYVER-maturin$MATURIN_VERSION-pytest$PYTEST_VERSION-numpy$NUMPY_VERSION"
if [ ! -x "$VENV/bin/maturin" ] || [ ! -x "$VENV/bin/pytest" ]; then
  rm -rf "$VENV"
  mkdir -p "$CACHE_DIR"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check \
    "maturin==$MATURIN_VERSION" "pytest==$PYTEST_VERSION" "numpy==$NUMPY_VERSION"
fi
export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"
