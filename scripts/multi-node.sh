#!/usr/bin/env bash
# Four node processes on 127.0.0.1–4 (docs/multi-node.md; CI runs this script as-is):
# node-1 publishes 256 pages of 64 KiB; node-2, node-3 and node-4 read all of them from node-1's
# memory and check every byte; then the cluster view and the metrics that prove the pages
# crossed nodes. Every process is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p peercache-store -p peercache-bench
BIN=target/release
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
META=127.0.0.1:$(free_port)     # the one discovery (meta) port of the cluster
METRICS_PORT=$(free_port)       # same port on every node; each node has its own address
PAGES=256
work=$(mktemp -d)
pids=()
cleanup() { kill -TERM "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

node_flags() {  # $1 = N: the node on 127.0.0.N
  echo --discovery-addr "$META" --host "127.0.0.$1" --set node_id="node-$1" \
    --set protocol=tcp --set global_segment_size=256mb --set metrics_port="$METRICS_PORT" \
    --set heartbeat_interval=0.5 --set member_ttl=2 --set log_level=warn
}
wait_for() {  # $1 = file, $2 = pattern, $3 = seconds
  local deadline=$((SECONDS + $3))
  until grep -q "$2" "$1" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then echo "timed out waiting for '$2' in $1" >&2; cat "$1" >&2; exit 1; fi
    sleep 0.1
  done
}

# 1. The writer: joins (hosting the meta server on 127.0.0.1), publishes its pages.
# shellcheck disable=SC2046
$BIN/peercache-bench serve $(node_flags 1) --preload $PAGES >"$work/1.out" 2>"$work/1.err" &
pids+=($!)
wait_for "$work/1.out" "^READY node-1 $PAGES" 60
echo "node-1 published $PAGES pages"

# 2. Three readers: each joins, then reads node-1's pages one-sided and checks every byte.
for n in 2 3 4; do
  # shellcheck disable=SC2046
  $BIN/peercache-bench serve $(node_flags $n) --read-from node-1 --read-count $PAGES \
    >"$work/$n.out" 2>"$work/$n.err" &
  pids+=($!)
done
for n in 2 3 4; do
  wait_for "$work/$n.out" "^READ node-1" 90
  line=$(grep "^READ node-1" "$work/$n.out")
  echo "node-$n: $line"
  [[ "$line" == *"hits=$PAGES/$PAGES wrong=0" ]] || { echo "node-$n did not read every page" >&2; exit 1; }
done

# 3. What the cluster says about itself.
$BIN/peercache-node status --discovery-addr "$META"

# 4. The metrics that prove the reads crossed nodes: remote hits on the readers, bytes served
#    by the writer's data server.
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
