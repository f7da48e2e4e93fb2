#!/usr/bin/env bash
# The observability stage: a three-node cluster scraped by a real Prometheus (promtool checks
# every node's exposition; every target up; rate(peercache_bytes_read_total[30s]) > 0 and every
# Grafana query answer through its HTTP API) and its dashboard loaded in a real headless
# Chromium (scripts/observability.py). Installs what it needs:
# * Prometheus: Debian's `prometheus` package is downloaded and unpacked into the cache
#   (`apt-get download` + `dpkg-deb -x`), so no service of the package is ever installed or
#   started; its binaries run on free loopback ports from a temporary folder;
# * Chromium and chromedriver: Debian's `chromium` and `chromium-driver`, installed with apt
#   when missing (root) — they start no service.
# Extra arguments go to the Python script (e.g. --screenshot docs/dashboard.png).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE_DIR="${CACHE_DIR:-${PEERCACHE_CI_CACHE:-$HOME/.cache/peercache-ci}}"
export DEBIAN_FRONTEND=noninteractive

apt_updated=0
apt_update_once() {
  if [ "$apt_updated" = 0 ]; then
    apt-get update -qq
    apt_updated=1
  fi
}

prom_dir=""
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  prom_dir="$(dirname "$(command -v prometheus)")"
else
  version="$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')"
  if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    apt_update_once
    version="$(apt-cache policy prometheus | awk '/Candidate:/ {print $2}')"
  fi
  prom_dir="$CACHE_DIR/prometheus-${version//[:+~]/_}/usr/bin"
  if [ ! -x "$prom_dir/prometheus" ] || [ ! -x "$prom_dir/promtool" ]; then
    tmp="$(mktemp -d)"
    (cd "$tmp" && apt-get download -qq "prometheus=$version" >/dev/null 2>&1) || {
      apt_update_once
      (cd "$tmp" && apt-get download -qq "prometheus=$version")
    }
    mkdir -p "$CACHE_DIR/prometheus-${version//[:+~]/_}"
    dpkg-deb -x "$tmp"/prometheus_*.deb "$CACHE_DIR/prometheus-${version//[:+~]/_}"
    rm -rf "$tmp"
  fi
fi
echo "prometheus: $("$prom_dir/prometheus" --version 2>&1 | head -1)"

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  apt_update_once
  apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi
echo "browser: $(chromium --version 2>/dev/null | head -1)"

cargo build --release --locked -q -p peercache-store
python3 scripts/observability.py --prometheus "$prom_dir" "$@"
