#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time on the stable toolchain (--sanitizer none).
# cargo-fuzz is installed once into a cache outside the clone, keyed by its version. Each target
# starts from a copy of its committed seed corpus, so the repository is not modified.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS="${FUZZ_SECS:-20}"
CARGO_FUZZ_VERSION=0.13.2
CACHE_DIR="${PEERCACHE_CI_CACHE:-$HOME/.cache/peercache-ci}"
ROOT="$CACHE_DIR/cargo-fuzz-$CARGO_FUZZ_VERSION"
if [ ! -x "$ROOT/bin/cargo-fuzz" ]; then
  cargo install -q --locked cargo-fuzz --version "$CARGO_FUZZ_VERSION" --root "$ROOT"
fi
export PATH="$ROOT/bin:$PATH"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd fuzz
for t in envelope frame slot_header disk_record transport_request handshake slotmap store_control slot_layout layout_spec; do
  cp -r "corpus/$t" "$work/$t"
  echo "fuzz $t for ${SECS}s"
  cargo fuzz run --sanitizer none -O "$t" "$work/$t" -- -max_total_time="$SECS" -rss_limit_mb=512 2>&1 | tail -n 1
done
