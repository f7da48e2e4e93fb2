#!/usr/bin/env bash
# The `rdma-verbs` CI stage: builds the RDMA-enabled binaries and the verbs lab tests on the
# host, then boots the soft-RoCE guest once (scripts/rdma-lab.sh) and runs
# scripts/rdma-verbs-guest.sh in it: perftest beside PeerCache's transport on kernel verbs, a
# three-node store with protocol=rdma, a storage server taking one-sided writes, and a short
# bench. Fails with the guest command's status.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prereqs.sh
need_rdma_build_tools "with --features rdma"
cargo build --release --locked -q -p peercache-store -p peercache-bench \
  --features peercache-store/rdma,peercache-bench/rdma --bins
cargo test --release --locked -q -p peercache-transport --features rdma --test verbs_lab --no-run
cargo test --release --locked -q -p peercache-store --features rdma --test verbs_lab --no-run
# The Python package, its extension built with `rdma` as shipped (maturin develop leaves it in
# peercache-py/python/peercache/). The guest imports it from there with the host's python3: the
# venv may live under a /tmp the guest cannot see.
bash scripts/python.sh -c 'import peercache' >/dev/null
LAB_TIMEOUT=${LAB_TIMEOUT:-420} bash scripts/rdma-lab.sh bash scripts/rdma-verbs-guest.sh
