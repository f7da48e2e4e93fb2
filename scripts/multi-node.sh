#!/usr/bin/env bash
# Four `peercache-node` processes on 127.0.0.1–4 and a driver (docs/multi-node.md; CI runs this
# script as-is): the driver writes 256 pages of 64 KiB on node-1 through its client API, reads
# them back through node-2, node-3 and node-4 (each fetches them from node-1's memory) and checks
# every byte; then the cluster view and the metrics that prove the pages crossed nodes. Every
# process is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p peercache-store
BIN=target/release
# One generated cluster secret for the four nodes and the tools (read from the environment).
PEERCACHE_CLUSTER_SECRET=${PEERCACHE_CLUSTER_SECRET:-$(python3 -c 'import secrets; print(secrets.token_hex(32))')}
export PEERCACHE_CLUSTER_SECRET
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
META=127.0.0.1:$(free_port)     # the one discovery (meta) port of the cluster
METRICS_PORT=$(free_port)       # same port on every node; each node has its own address
CLIENT_PORT=$(free_port)        # the client API the driver uses, same port on every node
work=$(mktemp -d)
pids=()
cleanup() { kill -TERM "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# The four nodes stand in for four hosts, so the host-local path (shared memory between
# processes on one host, on by default) is off: the pages cross the network path.
node_flags() {  # $1 = N: the node on 127.0.0.N
  echo --discovery-addr "$META" --host "127.0.0.$1" --set node_id="node-$1" \
    --set protocol=tcp --set host_local=false --set global_segment_size=256mb --set metrics_port="$METRICS_PORT" \
    --set client_enabled=true --set client_port="$CLIENT_PORT" \
    --set heartbeat_interval=0.5 --set member_ttl=2 --set log_level=warn
}

# 1. node-1 hosts the discovery (meta) server on 127.0.0.1; wait until it answers.
# shellcheck disable=SC2046
$BIN/peercache-node $(node_flags 1) 2>"$work/1.err" &
pids+=($!)
deadline=$((SECONDS + 60))
until $BIN/peercache-node status --discovery-addr "$META" --timeout 0.5 >/dev/null 2>&1; do
  if [ $SECONDS -ge $deadline ]; then echo "node-1 did not start" >&2; cat "$work/1.err" >&2; exit 1; fi
  sleep 0.2
done

# 2. Three more nodes join through it.
for n in 2 3 4; do
  # shellcheck disable=SC2046
  $BIN/peercache-node $(node_flags $n) 2>"$work/$n.err" &
  pids+=($!)
done

# 3. The driver: waits for the four members, writes on node-1, reads through the others.
$BIN/peercache-node drive --discovery-addr "$META" --members 4 --wait 60 \
  --write-on node-1 --pages 256 --page-size 64kb

# 4. What the cluster says about itself.
$BIN/peercache-node status --discovery-addr "$META"

# 5. The metrics that prove the reads crossed nodes: remote hits on the readers, bytes served
#    by node-1's data server.
for n in 1 2 3 4; do
  python3 - "$n" "$METRICS_PORT" <<'PY'
import sys, urllib.request
n, port = sys.argv[1], sys.argv[2]
text = urllib.request.urlopen(f"http://127.0.0.{n}:{port}/metrics", timeout=5).read().decode()
want = ("peercache_read_remote_hits_total", 'peercache_transport_bytes_total{', "peercache_members")
for line in text.splitlines():
    if line.startswith(want) and ('side="server"' in line or "transport" not in line):
        print(f"node-{n}  {line}")
PY
done
