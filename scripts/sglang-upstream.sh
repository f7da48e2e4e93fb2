#!/usr/bin/env bash
# The SGLang upstream kit, checked: applies sglang-pr/*.patch to a *copy* of the sglang package
# installed in the cached contract venv (never the venv itself), then shows with the patched
# copy first on PYTHONPATH that `--hicache-storage-backend peercache` parses, the factory builds
# PeerCacheStore by name (no dynamic-backend keys, no interface_v1), the controller's zero-copy
# list has it, and the patch's own registered test (a two-node round trip) passes.
# Installs this checkout's wheel in that venv first (scripts/wheel.sh; seconds when built).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/wheel.sh
source scripts/sglang-venv.sh
install_peercache_wheel
site=$(python -c 'import os, sglang; print(os.path.dirname(os.path.dirname(sglang.__file__)))')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$site/sglang" "$work/"
for p in sglang-pr/*.patch; do
  echo "applying $p to a copy of $site/sglang"
  patch -p2 -s -d "$work" < "$p"
done
export PYTHONPATH="$work"
python - <<'PY'
import argparse, inspect, os, sglang
assert sglang.__file__.startswith(os.environ["PYTHONPATH"]), sglang.__file__
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
args = p.parse_args(["--model-path", "m", "--hicache-storage-backend", "peercache"])
assert args.hicache_storage_backend == "peercache"
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
assert StorageBackendFactory._registry["peercache"]["module_path"] == "peercache.store"
import sglang.srt.managers.cache_controller as cc
src = inspect.getsource(cc)
zero_copy = src[src.index('"hf3fs",'):src.index('self.page_get_func = self._page_get_zero_copy')]
assert '"peercache"' in zero_copy, "peercache is not in the zero-copy backend list"
print("patched sglang: CLI choice, factory registration and zero-copy list are in place")
PY
python -m pytest -q -p no:cacheprovider "$work/registered/hicache/test_hicache_storage_peercache.py"
