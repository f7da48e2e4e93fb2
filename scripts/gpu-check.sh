#!/usr/bin/env bash
# The GPU check (#63): on a host with a CUDA device, installs the wheels scripts/gpu-wheels.sh
# built (carried as target/gpu-wheels) into a private folder and runs scripts/gpu_check.py:
# the direct-linker tests with SGLang's pools in GPU memory, the staged paths (linker and vLLM
# host mirror) beside plain pinned copies of the same bytes, and chunked registration of a
# large host region. Writes gpu-check.json and gpu-check.md under $OUT (the device tool's
# folder), else target/gpu-check. Without a CUDA device it prints one line and exits 0: CI's
# sglang stage runs that form. PEERCACHE_GPU_CHECK_DEVICE=cpu runs it on CPU instead, small:
# scripts/gpu-rehearse.sh does, in a stand-in for the host's Python.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${PEERCACHE_GPU_CHECK_DEVICE:-cuda}" = cpu ]; then
  # scripts/gpu-rehearse.sh: the same install and steps, on CPU, small.
  set -- --device cpu --quick "$@"
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "gpu-check: skipped: no CUDA device"
  exit 0
else
  nvidia-smi -L
fi
out="${OUT:-target/gpu-check}"
wheels="${PEERCACHE_GPU_WHEELS:-target/gpu-wheels}"
site="${PEERCACHE_GPU_SITE:-/tmp/peercache-gpu-site}"
mkdir -p "$out"
if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
  echo "gpu-check: no wheels in $wheels: build them with scripts/gpu-wheels.sh and carry that folder" >&2
  exit 1
fi
rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
  "$wheels"/*.whl || exit 1
# The wheels first; the import stand-ins (sgl_kernel: scripts/gpu-shims) only where nothing real is.
export PYTHONPATH="$site:$PWD/scripts/gpu-shims${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python3 scripts/gpu_check.py --out "$out" "$@" 2>&1 | tee "$out/gpu-check.log"
exit "${PIPESTATUS[0]}"
