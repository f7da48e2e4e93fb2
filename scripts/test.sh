#!/usr/bin/env bash
# The test suite: every Rust test, then the Python package's tests (the wheel is built into a
# cached venv). Needs only the Rust toolchain and Python 3; installs the rest. The Rust tests
# are built once with the `etcd` feature, so `discovery = "etcd"` runs against a real etcd
# (scripts/etcd.sh fetches Debian's; protoc builds the client).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/prereqs.sh
if ! command -v protoc >/dev/null 2>&1 || [ ! -e /usr/include/google/protobuf/descriptor.proto ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      protobuf-compiler libprotobuf-dev >/dev/null
  fi
fi
need_etcd_build_tools "the etcd tests"
PEERCACHE_ETCD_BIN="$(bash scripts/etcd.sh)"
export PEERCACHE_ETCD_BIN
cargo test --workspace --release --locked --features peercache-store/etcd
bash scripts/pytest.sh
