#!/usr/bin/env bash
# Packages every publishable crate the way the registry would and builds each from its
# `.crate` alone (cargo verifies against a local registry of the other packaged crates), so a
# file outside a crate, a missing README or LICENSE, or an unpublishable path dependency
# fails here. Shares the workspace target directory.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo package --workspace --exclude peercache-py --exclude peercache-bench --locked
