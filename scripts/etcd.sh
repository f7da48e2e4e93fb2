#!/usr/bin/env bash
# Prints the path of an etcd server binary for the tests: `etcd` on PATH if there is one, else
# Debian's `etcd-server` package downloaded and unpacked into the cache (`apt-get download` +
# `dpkg-deb -x`), so no service of the package is installed or started. The tests run it on
# free loopback ports in temporary data folders (peercache-wire's testkit::etcd).
set -euo pipefail
CACHE_DIR="${CACHE_DIR:-${PEERCACHE_CI_CACHE:-$HOME/.cache/peercache-ci}}"
export DEBIAN_FRONTEND=noninteractive
if command -v etcd >/dev/null 2>&1; then
  command -v etcd
  exit 0
fi
version="$(apt-cache policy etcd-server 2>/dev/null | awk '/Candidate:/ {print $2}')"
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  apt-get update -qq >&2
  version="$(apt-cache policy etcd-server | awk '/Candidate:/ {print $2}')"
fi
dir="$CACHE_DIR/etcd-server-${version//[:+~]/_}"
if [ ! -x "$dir/usr/bin/etcd" ]; then
  tmp="$(mktemp -d)"
  (cd "$tmp" && apt-get download -qq "etcd-server=$version" >/dev/null 2>&1) || {
    apt-get update -qq >&2
    (cd "$tmp" && apt-get download -qq "etcd-server=$version" >&2)
  }
  mkdir -p "$dir"
  dpkg-deb -x "$tmp"/etcd-server_*.deb "$dir"
  rm -rf "$tmp"
fi
"$dir/usr/bin/etcd" --version >&2
echo "$dir/usr/bin/etcd"
