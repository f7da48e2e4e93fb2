#!/usr/bin/env bash
# Two real SGLang 0.5.23 servers sharing one PeerCache cluster, end to end (never in CI):
#   * a tiny Llama-shaped model with random weights, generated locally with `transformers`
#     (no download), served with --skip-tokenizer-init and `input_ids` requests;
#   * server A answers a long prompt cold and publishes its KV pages to PeerCache (HiCache L3,
#     write-through); server B gets the same prompt, must read A's pages (its PeerCache node's
#     `peercache_read_remote_hits_total` > 0) and must answer with the same greedy tokens as A's
#     cold run.
# Needs a CUDA device: SGLang's server imports sgl_kernel ops at start, and PyPI's sglang-kernel
# wheel carries CUDA builds only (the CPU engine needs a CPU build compiled from SGLang's source
# tree, published nowhere). Without a device it prints one line and exits 0.
# Environment: PYTHON (default python3), PEERCACHE_CI_CACHE (venv cache, as the CI's),
# E2E_PORT_BASE (default 40000; uses +0..+20).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "sglang-e2e: skipped: no CUDA device here (nvidia-smi lists none); run it on a GPU host"
  exit 0
fi

SGLANG_VERSION=0.5.23
PY="${PYTHON:-python3}"
CACHE_DIR="${PEERCACHE_CI_CACHE:-$HOME/.cache/peercache-ci}"
VENV="$CACHE_DIR/sglang-e2e-venv-sglang$SGLANG_VERSION"
if [ ! -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "sglang[all]==$SGLANG_VERSION" maturin
  touch "$VENV/.complete"
fi
export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
maturin develop --release -q -m peercache-py/Cargo.toml

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# The model: Llama-shaped, 4 layers, random weights from a fixed seed.
python - "$work/model" <<'EOF'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=8192,
                  torch_dtype="bfloat16")
LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(sys.argv[1])
EOF

base=${E2E_PORT_BASE:-40000}
meta=$((base + 1))
launch() { # name http_port metrics_port
  local cfg
  cfg=$(printf '{"backend_name":"peercache","module_path":"peercache.store","class_name":"PeerCacheStore","interface_v1":1,"discovery_addr":"127.0.0.1:%d","local_hostname":"127.0.0.1","node_id":"e2e-%s","protocol":"tcp","metrics_port":%d,"global_segment_size":"2gb","startup_timeout":60}' "$meta" "$1" "$3")
  python -m sglang.launch_server --model-path "$work/model" --skip-tokenizer-init \
    --host 127.0.0.1 --port "$2" --page-size 16 --mem-fraction-static 0.25 \
    --enable-hierarchical-cache --hicache-write-policy write_through \
    --hicache-storage-prefetch-policy wait_complete \
    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config "$cfg" \
    > "$work/server-$1.log" 2>&1 &
  pids+=($!)
}
wait_http() { # port
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    sleep 0.5
  done
  echo "sglang-e2e: server on :$1 did not come up; its log:"; tail -n 40 "$work"/server-*.log
  exit 1
}
launch a $((base + 10)) $((base + 11))
launch b $((base + 12)) $((base + 13))
wait_http $((base + 10))
wait_http $((base + 12))

python - "$base" <<'EOF'
import json, sys, time, urllib.request
base = int(sys.argv[1])
def post(port, ids):
    body = json.dumps({"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 32}})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", body.encode(),
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=300).read())["output_ids"]
def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(name))
prompt = [(i * 7919) % 2000 + 1 for i in range(4096)]
cold = post(base + 10, prompt)
# Server A's write-through reaches PeerCache in the background: wait for its pages.
deadline = time.time() + 120
while metric(base + 11, "peercache_bytes_written_total") == 0:
    assert time.time() < deadline, "server A never published a page"
    time.sleep(0.5)
warm = post(base + 12, prompt)
remote = metric(base + 13, "peercache_read_remote_hits_total")
print(f"sglang-e2e: server B read {remote:.0f} pages from server A; outputs equal: {warm == cold}")
assert remote > 0, "server B read no page from server A"
assert warm == cold, f"greedy outputs differ: cold {cold[:8]}… warm {warm[:8]}…"
print("sglang-e2e: ok")
EOF
