#!/usr/bin/env bash
# The SGLang contract test: installs this checkout's wheel (scripts/wheel.sh) into the cached
# venv with the real sglang 0.5.23 (scripts/sglang-venv.sh) and runs peercache-py/tests/sglang/ against SGLang's own classes.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/wheel.sh
source scripts/sglang-venv.sh
install_peercache_wheel
python -c 'import sglang, torch; print(f"sglang {sglang.__version__}, torch {torch.__version__} (cuda available: {torch.cuda.is_available()})")'
pytest -q -p no:cacheprovider peercache-py/tests/sglang "$@"
