#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh carries to a GPU host, into target/gpu-wheels/: this
# checkout's wheel for any CPython ≥ 3.11 (abi3, stripped: the device runs 3.12), and the
# wheels of every distribution the linker tests import that the device image lacks, found by
# scripts/gpu_wheels.py tracing the imports in the SGLang contract venv (not a hand-kept list).
# Then: the device tool's run with carry ["target/gpu-wheels"] and the command
# `bash scripts/gpu-check.sh` (docs/performance.md, "GPU check").
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${CARGO_TARGET_DIR:-target}/gpu-wheels"
own="$dest.peercache"
rm -rf "$dest" "$own"
(
  source scripts/venv.sh
  maturin build --release --strip -q -m peercache-py/Cargo.toml --features pyo3/abi3-py311 -o "$own" >&2
)
source scripts/sglang-venv.sh
pip install -q --disable-pip-version-check --no-deps --force-reinstall "$own"/peercache-*.whl
python scripts/gpu_wheels.py --download "$dest"
mv "$own"/peercache-*.whl "$dest"/
rmdir "$own"
# What travels to the device: 64 MiB with the working tree (about 4 MiB).
limit=$((56 * 1024 * 1024))
total=$(du -cb "$dest"/*.whl | tail -1 | cut -f1)
echo "gpu-wheels: $(ls "$dest"/*.whl | wc -l) wheels, $((total / 1024 / 1024)) MiB in $dest"
if [ "$total" -gt "$limit" ]; then
  echo "gpu-wheels: over the 56 MiB that can travel beside the working tree" >&2
  exit 1
fi
