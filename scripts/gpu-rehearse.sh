#!/usr/bin/env bash
# A rehearsal of the GPU check (#63) on this machine, before any device time is spent. It builds
# (once, cached outside the clone) a stand-in for the GPU host's Python: CPython 3.12 with
# torch 2.11.0 and every other distribution the check loads that the host's image holds, at the
# image's versions where the device notes read one (scripts/gpu_wheels.py --held, traced in the
# SGLang contract venv), and nothing else. Then scripts/gpu-check.sh installs the carried wheels
# (target/gpu-wheels, from scripts/gpu-wheels.sh) into it exactly as on the host, and runs the
# whole check on CPU (--device cpu --quick) into target/gpu-rehearsal, and last imports every
# module the check imports with torch pretending to see a GPU (scripts/gpu_rehearse_imports.py).
#
# It catches what would waste a device run: a carried wheel that does not install or load
# under 3.12, a module the slimming left out, an import that breaks under the host's torch or
# transformers, a distribution neither carried nor held. It cannot catch anything CUDA does.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION=2.11.0   # the host's (device notes, 2026-11)
CACHE_DIR="${PEERCACHE_CI_CACHE:-$HOME/.cache/peercache-ci}"
py312="${PEERCACHE_PY312:-}"
if [ -z "$py312" ]; then
  for c in "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12; do
    [ -x "$c" ] && py312="$c" && break
  done
fi
if [ -z "$py312" ]; then
  echo "gpu-rehearse: no CPython 3.12 here (set PEERCACHE_PY312)" >&2
  exit 1
fi
wheels="${PEERCACHE_GPU_WHEELS:-target/gpu-wheels}"
if ! ls "$wheels"/*.whl >/dev/null 2>&1; then
  echo "gpu-rehearse: no wheels in $wheels: run scripts/gpu-wheels.sh first" >&2
  exit 1
fi
held=$(mktemp)
trap 'rm -f "$held"' EXIT
(source scripts/sglang-venv.sh && python scripts/gpu_wheels.py --held) >"$held"
key=$( (echo "$TORCH_VERSION"; "$py312" -V; cat "$held") | sha256sum | cut -c1-12)
venv="$CACHE_DIR/gpu-rehearsal-venv-py3.12-torch$TORCH_VERSION-$key"
if [ ! -f "$venv/.complete" ]; then
  rm -rf "$venv"
  "$py312" -m venv "$venv"
  pipi() { "$venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir "$@"; }
  # torch with what it links (its CUDA libraries load at import, GPU or not) ...
  pipi "torch==$TORCH_VERSION"
  # ... then the held list exactly, nothing pulled in beside it.
  pipi --no-deps -r "$held"
  touch "$venv/.complete"
fi
echo "gpu-rehearse: the host's stand-in: $venv ($(wc -l <"$held") held distributions)"
rc=0
PATH="$venv/bin:$PATH" PEERCACHE_GPU_CHECK_DEVICE=cpu OUT="${CARGO_TARGET_DIR:-target}/gpu-rehearsal" \
  bash scripts/gpu-check.sh "$@" || rc=$?
# SGLang's CUDA-only import branches, which the CPU run above never takes, against the
# stand-in, with the wheels gpu-check.sh just installed.
PYTHONPATH="${PEERCACHE_GPU_SITE:-/tmp/peercache-gpu-site}:$PWD/scripts/gpu-shims" \
  "$venv/bin/python" scripts/gpu_rehearse_imports.py || rc=$?
exit "$rc"
