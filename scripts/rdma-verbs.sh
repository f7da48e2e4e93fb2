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
# `drive --gpu` against a real CUDA runtime: the SGLang venv's torch (built by the earlier
# `sglang` stage) ships libcudart. There is no GPU driver here, so the bench must load the
# runtime, resolve every entry point it uses and stop with CUDA's own error in one line.
cudart=$(ls "${PEERCACHE_CI_CACHE:-$HOME/.cache/peercache-ci}"/sglang-venv-*/lib/python3*/site-packages/nvidia/cu*/lib/libcudart.so.* 2>/dev/null | head -n1 || true)
if [ -n "$cudart" ]; then
  out=$(PEERCACHE_CUDART="$cudart" target/release/peercache-bench drive --gpu --protocol rdma 2>&1 || true)
  # Printed with >&2, not `tee /dev/stderr`: tee opens that path anew and truncates a log file
  # the run's output is redirected to.
  err=$(echo "$out" | grep '^error: ' || true)
  echo "$err" >&2
  echo "$err" | grep -q 'cudaGetDeviceCount: CUDA error' \
    || { echo "drive --gpu with $cudart: unexpected: $out" >&2; exit 1; }
elif [ "${CI:-}" = true ]; then
  echo "no libcudart in the SGLang venv (the sglang stage builds it)" >&2; exit 1
else
  echo "skipping the CUDA runtime check: no SGLang venv with libcudart"
fi
# The Python package, its extension built with `rdma` as shipped (maturin develop leaves it in
# peercache-py/python/peercache/). The guest imports it from there with the host's python3: the
# venv may live under a /tmp the guest cannot see.
bash scripts/python.sh -c 'import peercache' >/dev/null
LAB_TIMEOUT=${LAB_TIMEOUT:-420} bash scripts/rdma-lab.sh bash scripts/rdma-verbs-guest.sh
