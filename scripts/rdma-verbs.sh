#!/usr/bin/env bash
# The `rdma-verbs` CI stage: builds the RDMA-enabled binaries and the verbs lab tests on the
# host, then boots the soft-RoCE guest once (scripts/rdma-lab.sh) and runs
# scripts/rdma-verbs-guest.sh in it: perftest beside PeerCache's transport on kernel verbs, and
# a three-node store with protocol=rdma. Fails with the guest command's status.
set -euo pipefail
cd "$(dirname "$0")/.."
FEATURES=${RDMA_FEATURES:-peercache-store/rdma,peercache-bench/rdma,peercache-py/rdma}
cargo build --release --locked -q -p peercache-store --features peercache-store/rdma --bins
cargo test --release --locked -q -p peercache-transport --features rdma --test verbs_lab --no-run
LAB_TIMEOUT=${LAB_TIMEOUT:-420} bash scripts/rdma-lab.sh bash scripts/rdma-verbs-guest.sh
