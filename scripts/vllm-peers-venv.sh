#!/usr/bin/env bash
# Sourced by scripts/vllm-bench.sh for the peers' rows: creates (once) a venv layered on the
# cached vLLM venv (scripts/vllm-venv.sh; a .pth puts its site-packages behind this venv's
# own, so vLLM and torch are those of the vLLM stage) with the peers' connectors' packages:
# Mooncake's TCP-capable build (mooncake-transfer-engine-non-cuda, which vLLM's
# MooncakeStoreConnector imports as `mooncake.store`) and LMCache (vLLM's LMCacheConnectorV1),
# with whatever else they require. Exports VIRTUAL_ENV and PATH for it. Outside the clone,
# keyed by every version; not used by CI (the benchmark is run by hand: docs/vllm.md).
MOONCAKE_VERSION=0.3.13.post1
LMCACHE_VERSION=0.5.6
PEERS_RECIPE=1
source "$(dirname "${BASH_SOURCE[0]}")/vllm-venv.sh"
PEVENV="$CACHE_DIR/vllm-peers-r$PEERS_RECIPE-mooncake$MOONCAKE_VERSION-lmcache$LMCACHE_VERSION-on-$(basename "$VLVENV")"
if [ ! -f "$PEVENV/.complete" ]; then
  rm -rf "$PEVENV"
  "$PY" -m venv "$PEVENV"
  base_site=$("$VLVENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  own_site=$("$PEVENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$base_site" > "$own_site/zz-vllm-venv.pth"
  "$PEVENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir \
    "mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION" "lmcache==$LMCACHE_VERSION"
  touch "$PEVENV/.complete"
fi
export VIRTUAL_ENV="$PEVENV"
export PATH="$PEVENV/bin:$PATH"
