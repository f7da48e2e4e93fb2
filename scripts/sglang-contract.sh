#!/usr/bin/env bash
# The SGLang contract test: installs this checkout's wheel (scripts/wheel.sh) into the cached
# venv with the real sglang 0.5.23 (scripts/sglang-venv.sh) and runs peercache-py/tests/sglang/ against SGLang's own classes;
# then the GPU check's CPU forms (below).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/wheel.sh
source scripts/sglang-venv.sh
install_peercache_wheel
python -c 'import sglang, torch; print(f"sglang {sglang.__version__}, torch {torch.__version__} (cuda available: {torch.cuda.is_available()})")'
pytest -q -p no:cacheprovider peercache-py/tests/sglang "$@"
# The GPU check (#63): its carried-wheel list traced in this venv (scripts/gpu-wheels.sh downloads
# it for a device run), its measurements run small on CPU so they keep working between device
# runs, and the check itself, which on a host without a CUDA device says so in one line.
python scripts/gpu_wheels.py >/dev/null
python scripts/gpu_check.py --device cpu --quick --reps 2 --no-linker-tests --out "${CARGO_TARGET_DIR:-target}/gpu-check-cpu" >/dev/null
bash scripts/gpu-check.sh
