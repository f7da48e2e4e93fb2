#!/usr/bin/env bash
# The test suite: every Rust test, then the Python package's tests (the wheel is built into a
# cached venv). Needs only the Rust toolchain and Python 3; installs the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --release --locked
bash scripts/pytest.sh
