#!/usr/bin/env bash
# The hostile stage (docs/operations.md, threat model): connection-level attacks against real
# `peercache-node` processes on 127.0.0.N — a stranger trickling a handshake on every port
# (data, control, meta, client API, same-host attach), a connection flood under a low
# descriptor limit (CPU time and log lines bounded). They run one at a time, apart from the
# main suite, because they measure a process's CPU and file descriptors.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release --locked -p peercache-store --test hostile --no-run -q
timeout 300 cargo test --release --locked -p peercache-store --test hostile -- \
  --ignored --test-threads 1
