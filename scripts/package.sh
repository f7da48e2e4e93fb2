#!/usr/bin/env bash
# Packages every publishable crate the way the registry would and builds each from its
# `.crate` alone (cargo verifies against a local registry of the other packaged crates), so a
# file outside a crate, a missing README or LICENSE, or an unpublishable path dependency
# fails here. Shares the workspace target directory.
set -euo pipefail
cd "$(dirname "$0")/.."
# Cargo unpacks the verification registry into $CARGO_HOME/registry/src/-<hash of this
# checkout's path>/ and reuses an unpacked crate of the same name and version: a second run
# from the same path (CI's clone) would build against the previous run's sources. Drop them.
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
for d in "$cargo_home"/registry/src/-*/peercache-* "$cargo_home"/registry/cache/-*/peercache-*; do
    [ -e "$d" ] && rm -rf "$d"
done
# Its builds of those crates are fingerprinted by name and version only, so a rerun in the same
# target directory would reuse them too: drop their fingerprints (cargo then rebuilds them).
target="${CARGO_TARGET_DIR:-target}"
rm -rf "$target/package" "$target"/debug/.fingerprint/peercache-*
cargo package --workspace --exclude peercache-py --exclude peercache-bench --locked
