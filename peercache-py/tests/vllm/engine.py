"""One real vLLM engine in its own process, driven by the end-to-end tests and the benchmark.

    python engine.py SPEC_JSON RESULT_FD

SPEC (JSON): {"model": dir, "kv": null | KVTransferConfig kwargs, "prefix_caching": bool,
"dtype": "bfloat16", "block_size": 32, "kv_cache_gb": 1.0, "max_model_len": 8192, "metrics": "host:port" | null,
"kv_events": null | "tcp://host:port" (vLLM's KV-event publisher binds there)}.

The engine starts, writes ``{"ready": start seconds}`` (or ``{"error": why}``, and exits) as one
JSON line to RESULT_FD, then
takes commands, one JSON line each on stdin, and answers each with one JSON line on RESULT_FD:

- ``{"run": [[ids...], ...], "max_tokens": n}``: each prompt greedily, one at a time: first
  with ``max_tokens=1`` (its time is the request's time to first token), then the full answer
  (with ``"answer": false``, only the first). ``"params": [{...} | null, ...]`` gives each
  prompt's ``kv_transfer_params`` (a router's hint). Answers ``{"ttft_s": [...], "tokens": [[...]...],
  "node": {counter: value}}`` (the node's ``peercache_*`` counters, when ``metrics`` is set).
- ``{"node": true}``: the node's counters now.

EOF on stdin ends the process.
"""

import json
import os
import sys
import time
import urllib.request


def scrape(endpoint):
    """Sums of every ``peercache_*`` series at ``endpoint``'s ``/metrics``, by name."""
    if not endpoint:
        return {}
    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("peercache_") and " " in line:
            name, value = line.rsplit(" ", 1)
            base = name.split("{", 1)[0]
            out[base] = out.get(base, 0.0) + float(value)
    return out


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    results = os.fdopen(int(sys.argv[2]), "w", buffering=1)
    from vllm import LLM, SamplingParams
    from vllm.config import KVEventsConfig, KVTransferConfig
    from vllm.inputs import TokensPrompt

    kv = KVTransferConfig(**spec["kv"]) if spec.get("kv") else None
    events = (KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=spec["kv_events"])
              if spec.get("kv_events") else None)
    t0 = time.perf_counter()
    try:
        llm = LLM(model=spec["model"], skip_tokenizer_init=True, block_size=spec.get("block_size", 32),
                  enforce_eager=True, dtype=spec.get("dtype", "bfloat16"), max_model_len=spec.get("max_model_len", 8192),
                  kv_cache_memory_bytes=int(spec.get("kv_cache_gb", 1.0) * (1 << 30)),
                  enable_prefix_caching=spec.get("prefix_caching", False),
                  kv_transfer_config=kv, kv_events_config=events, seed=0)
    except Exception as e:  # the engine did not start: say why, and do not linger
        results.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        results.flush()
        os._exit(1)
    results.write(json.dumps({"ready": time.perf_counter() - t0}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if "run" in cmd:
            tokens, ttft = [], []
            params = cmd.get("params") or [None] * len(cmd["run"])
            for ids, kv_params in zip(cmd["run"], params):
                extra = {"kv_transfer_params": kv_params} if kv_params is not None else None
                first = SamplingParams(temperature=0, max_tokens=1, detokenize=False, extra_args=extra)
                full = SamplingParams(temperature=0, max_tokens=cmd.get("max_tokens", 8), detokenize=False,
                                      extra_args=extra)
                t = time.perf_counter()
                out = llm.generate([TokensPrompt(prompt_token_ids=ids)], first, use_tqdm=False)
                ttft.append(time.perf_counter() - t)
                if cmd.get("answer", True):
                    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], full, use_tqdm=False)
                tokens.append(list(out[0].outputs[0].token_ids))
            results.write(json.dumps({"ttft_s": ttft, "tokens": tokens, "node": scrape(spec.get("metrics"))}) + "\n")
        elif "node" in cmd:
            results.write(json.dumps({"node": scrape(spec.get("metrics"))}) + "\n")
    results.close()
    os._exit(0)  # the engine's worker processes need not be joined one by one


if __name__ == "__main__":
    main()
