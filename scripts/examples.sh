#!/usr/bin/env bash
# Runs the examples: the Rust ones, and the Python one against the wheel built from this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every node and tool below proves this run's generated cluster secret (read from the
# environment by the config loader, the Python facade and the tools).
PEERCACHE_CLUSTER_SECRET=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
export PEERCACHE_CLUSTER_SECRET
cargo run --release --locked -q -p peercache-store --example two_nodes
cargo run --release --locked -q -p peercache-store --example node_from_config
cargo run --release --locked -q -p peercache-store --example quickstart
bash scripts/python.sh examples/python_roundtrip.py
bash scripts/python.sh examples/pd_handoff.py
# The four-process walk-through of docs/multi-node.md.
bash scripts/multi-node.sh
