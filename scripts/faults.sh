#!/usr/bin/env bash
# Runs the fault suite (peercache-bench/tests/faults.rs): real node processes on
# 127.0.0.N killed with -9, stopped with SIGSTOP, cut off by a silent proxy, discovery masters
# killed one by one — under a steady exists/get/set load with every byte checked. Each scenario
# prints a `FAULT-RESULT {json}` line; they are collected into $FAULTS_OUT when set.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Build first (not part of the 5-minute budget of the scenarios themselves).
cargo test --release --locked -p peercache-bench --test faults --no-run -q
timeout 300 cargo test --release --locked -p peercache-bench --test faults -- \
  --ignored --test-threads 1 --nocapture >"$log" 2>&1 || true
grep -E '^(FAULT-RESULT|test result|failures:|thread )' "$log" || true
if [ -n "${FAULTS_OUT:-}" ]; then
  grep '^FAULT-RESULT ' "$log" | sed 's/^FAULT-RESULT //' > "$FAULTS_OUT"
fi
if ! grep -q '^test result: ok' "$log"; then
  echo "fault suite failed" >&2
  tail -n 60 "$log" >&2
  exit 1
fi
