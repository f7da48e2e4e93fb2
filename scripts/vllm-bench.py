"""Time to first token of real vLLM engines on a shared-prefix workload, PeerCache beside
vLLM's own options and the peers' connectors, in one run (docs/vllm.md, "Benchmark").

    bash scripts/vllm-bench.sh [--layers 6 --hidden 768 --system 1536 --users 4]
                               [--json out.json] [--md out.md]

Engine A answers the first turn of `users` conversations that share one long system prompt;
engine B (another process, another node) then answers three kinds of requests:
`repeat` (A's prompts again), `new-user` (the same system prompt, new questions) and
`next-turn` (each conversation's second turn: A's prompt, A's answer, a new question). Rows:

- cold: B with no connector and no prefix cache (every token computed);
- vllm-prefix-cache: A's and B's requests in one engine with vLLM's own prefix cache (the
  upper bound: nothing crosses a process);
- example-connector: vLLM's ExampleConnector (its reference disk connector), A saves, B loads;
- offloading-connector: vLLM's OffloadingConnector (CPU tier), where it runs on this platform;
- peercache: PeerCacheConnector, A on node 127.0.0.51, B on node 127.0.0.52;
- mooncake-store: vLLM's MooncakeStoreConnector on Mooncake Store over TCP (a
  `mooncake_master` with its HTTP metadata server on loopback; each engine a Mooncake client
  contributing a segment), when `mooncake.store` imports (scripts/vllm-peers-venv.sh);
- lmcache: vLLM's LMCacheConnectorV1, A and B sharing one `lmcache_server` on loopback as
  their remote tier (a local CPU tier each), when `lmcache` imports.

A row that cannot run keeps its place and says why: the engine's first error line.

Each row's greedy tokens must equal the cold row's. TTFT is the time of a `max_tokens=1`
request; prefill throughput is prompt tokens over the sum of those times.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "peercache-py" / "tests" / "vllm"))

from harness import Engine, Meta, connector, free_port, prompts_sharing  # noqa: E402
from model import make_model  # noqa: E402

KINDS = ("repeat", "new-user", "next-turn")


def workload(system: int, users: int, question: int, seed: int = 5):
    """A's first turns, and the question tokens of B's new users and next turns."""
    first = prompts_sharing(system, question, 2 * users, seed=seed)
    a_prompts, new_users = first[:users], first[users:]
    follow = prompts_sharing(0, 48, users, seed=seed + 1)
    return a_prompts, new_users, follow


def b_prompts(a_prompts, a_answers, new_users, follow) -> Dict[str, List[List[int]]]:
    nxt = [p + ans + q for p, ans, q in zip(a_prompts, a_answers, follow)]
    return {"repeat": a_prompts, "new-user": new_users, "next-turn": nxt}


def run_b(engine: Engine, prompts: Dict[str, List[List[int]]], max_tokens: int):
    flat = [p for k in KINDS for p in prompts[k]]
    out = engine.run(flat, max_tokens=max_tokens, timeout=1800)
    ttft, tokens, i = {}, {}, 0
    for k in KINDS:
        n = len(prompts[k])
        ttft[k], tokens[k] = out["ttft_s"][i:i + n], out["tokens"][i:i + n]
        i += n
    return ttft, tokens, out.get("node", {})


def summarize(name: str, ttft, tokens, prompts, extra: Optional[dict] = None) -> dict:
    allt = [t for k in KINDS for t in ttft[k]]
    ntok = sum(len(p) for k in KINDS for p in prompts[k])
    row = {"row": name, "ran": True, "ttft_p50_s": statistics.median(allt),
           "ttft_p50_by_kind_s": {k: statistics.median(ttft[k]) for k in KINDS},
           "prefill_tokens_per_s": ntok / sum(allt), "tokens": tokens}
    row.update(extra or {})
    return row


def not_run(name: str, why: str) -> dict:
    return {"row": name, "ran": False, "why": why}


# Lines in a peer engine's log that mean its connector never worked (the engine still answers,
# computing every token): the first one found, with the error line after it, is the row's why.
PEER_FAILURES = ("Failed to initialize LMCacheManager",)


def peer_failure(work: str, name: str) -> Optional[str]:
    """Why peer row ``name``'s connector did not work, from its engines' logs, or None."""
    for side in ("a", "b"):
        log = Path(work, f"{name}-{side}.log")
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        for i, line in enumerate(lines):
            if any(p in line for p in PEER_FAILURES):
                cause = next((x.strip() for x in lines[i + 1:i + 40] if re.match(r"^\w*(Error|Exception):", x.strip())), "")
                head = re.sub(r"\x1b\[[0-9;]*m", "", line).strip()
                return f"engine {side}: {head[:300]} … {cause[:300]}".strip()
    return None


def _serve(argv: List[str], port: int, what: str, log: str) -> subprocess.Popen:
    """Starts a peer's server process and waits (30 s) until ``port`` on loopback listens."""
    proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port}: {Path(log).read_text()[-600:]}")
            time.sleep(0.1)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@contextlib.contextmanager
def mooncake_row(work: str) -> Iterator[Tuple[dict, Dict[str, str]]]:
    """Mooncake Store over TCP on loopback: one master (with its HTTP metadata server); each
    engine's MooncakeStoreConnector is a client contributing a 1 GB segment."""
    rpc, http = free_port(), free_port()
    master = _serve([shutil.which("mooncake_master") or "mooncake_master", f"--rpc_port={rpc}",
                     "--rpc_address=127.0.0.1", "--enable_http_metadata_server=true",
                     "--http_metadata_server_host=127.0.0.1", f"--http_metadata_server_port={http}"],
                    rpc, "mooncake_master", os.path.join(work, "mooncake-master.log"))
    try:
        cfg = os.path.join(work, "mooncake.json")
        Path(cfg).write_text(json.dumps({
            "metadata_server": f"http://127.0.0.1:{http}/metadata", "master_server_address": f"127.0.0.1:{rpc}",
            "protocol": "tcp", "device_name": "", "global_segment_size": "1GB", "local_buffer_size": "256MB"}))
        yield ({"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both", "kv_connector_extra_config": {}},
               {"MOONCAKE_CONFIG_PATH": cfg})
    finally:
        _stop(master)


@contextlib.contextmanager
def lmcache_row(work: str) -> Iterator[Tuple[dict, Dict[str, str]]]:
    """LMCache: each engine's LMCacheConnectorV1 with a local CPU tier and one shared
    `lmcache_server` on loopback as the remote tier, so B can load what A stored."""
    port = free_port()
    server = _serve([shutil.which("lmcache_server") or "lmcache_server", "127.0.0.1", str(port)],
                    port, "lmcache_server", os.path.join(work, "lmcache-server.log"))
    try:
        env = {"LMCACHE_CHUNK_SIZE": "256", "LMCACHE_LOCAL_CPU": "True", "LMCACHE_MAX_LOCAL_CPU_SIZE": "2",
               "LMCACHE_REMOTE_URL": f"lm://127.0.0.1:{port}", "LMCACHE_REMOTE_SERDE": "naive"}
        yield {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}, env
    finally:
        _stop(server)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--system", type=int, default=1792, help="shared system prompt tokens")
    ap.add_argument("--question", type=int, default=256, help="tokens of each user's question")
    ap.add_argument("--users", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--dtype", default="float32",
                    help="model dtype; in bfloat16 even vLLM's own prefix cache changes tokens of a "
                         "random-weight model against a cold engine (near-tie logits)")
    ap.add_argument("--rows", default="cold,vllm-prefix-cache,example-connector,offloading-connector,peercache,lmcache,mooncake-store")
    ap.add_argument("--json", help="write the report as JSON here")
    ap.add_argument("--md", help="write the report as Markdown here")
    args = ap.parse_args()
    rows_wanted = args.rows.split(",")
    work = tempfile.mkdtemp(prefix="pc-vllm-bench-")
    model = make_model(os.path.join(work, "model"), layers=args.layers, hidden=args.hidden)
    a_prompts, new_users, follow = workload(args.system, args.users, args.question)
    base = {"model": model, "kv": None, "kv_cache_gb": 2.0, "dtype": args.dtype}
    report = {"config": {k: getattr(args, k) for k in ("layers", "hidden", "system", "question", "users", "max_tokens", "dtype")},
              "rows": []}

    def engine(name, env=None, **spec):
        e = Engine(name, {**base, **spec}, work, env=env)
        try:
            e.ready()
        except BaseException:
            e.stop()
            raise
        return e

    # Cold: also yields A's answers, which define the next-turn prompts for every row.
    cold = engine("cold")
    try:
        a_out = cold.run(a_prompts, max_tokens=args.max_tokens, timeout=1800)
        prompts = b_prompts(a_prompts, a_out["tokens"], new_users, follow)
        ttft, tokens, _ = run_b(cold, prompts, args.max_tokens)
    finally:
        cold.stop()
    report["rows"].append(summarize("cold", ttft, tokens, prompts))
    reference = tokens

    def pair(name: str, kv_a: Optional[dict], kv_b: Optional[dict], spec_b: Optional[dict] = None,
             env: Optional[Dict[str, str]] = None, **extra_spec):
        a = engine(f"{name}-a", env=env, kv=kv_a, **extra_spec)
        try:
            a.run(a_prompts, max_tokens=args.max_tokens, timeout=1800)
            b = engine(f"{name}-b", env=env, kv=kv_b, **(spec_b or {}), **extra_spec)
            try:
                return run_b(b, prompts, args.max_tokens)
            finally:
                b.stop()
        finally:
            a.stop()

    for name in rows_wanted:
        if name == "cold":
            continue
        try:
            if name == "vllm-prefix-cache":
                e = engine(name, prefix_caching=True)
                try:
                    e.run(a_prompts, max_tokens=args.max_tokens, timeout=1800)
                    ttft, tokens, _ = run_b(e, prompts, args.max_tokens)
                finally:
                    e.stop()
                row = summarize(name, ttft, tokens, prompts)
            elif name == "example-connector":
                kv = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {"shared_storage_path": os.path.join(work, "example")}}
                ttft, tokens, _ = pair(name, kv, kv)
                row = summarize(name, ttft, tokens, prompts)
            elif name == "offloading-connector":
                kv = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30}}
                ttft, tokens, _ = pair(name, kv, kv)
                row = summarize(name, ttft, tokens, prompts)
            elif name == "peercache":
                secret_file = os.path.join(work, "secret")
                with open(secret_file, "w") as f:
                    f.write(secrets.token_hex(16))
                os.chmod(secret_file, 0o600)
                meta = Meta("127.0.0.50", secret_file)
                try:
                    secret = open(secret_file).read()
                    ma, mb = free_port("127.0.0.51"), free_port("127.0.0.52")
                    ttft, tokens, node = pair(
                        name, connector("127.0.0.51", meta.addr, secret, ma, global_segment_size="2gb"),
                        connector("127.0.0.52", meta.addr, secret, mb, global_segment_size="2gb"),
                        spec_b={"metrics": f"127.0.0.52:{mb}"})
                finally:
                    meta.stop()
                row = summarize(name, ttft, tokens, prompts,
                                {"remote_blocks_read": node.get("peercache_read_remote_hits_total", 0)})
            elif name in ("lmcache", "mooncake-store"):
                module = "lmcache" if name == "lmcache" else "mooncake.store"
                try:
                    importlib.import_module(module)
                except Exception as e:  # the package is not in this venv
                    row = not_run(name, f"`import {module}` failed here: {type(e).__name__}: {e} "
                                        "(scripts/vllm-peers-venv.sh installs it)")
                else:
                    launch = mooncake_row if name == "mooncake-store" else lmcache_row
                    with launch(work) as (kv, env):
                        ttft, tokens, _ = pair(name, kv, kv, env=env)
                    row = summarize(name, ttft, tokens, prompts)
                    broken = peer_failure(work, name)
                    if broken:  # the engines answered, but without the connector doing its job
                        same = sum(a == b for k in KINDS for a, b in zip(row["tokens"][k], reference[k]))
                        n = sum(len(prompts[k]) for k in KINDS)
                        row = not_run(name, f"{broken}; the engines still answered, computing every token: "
                                            f"TTFT p50 {row['ttft_p50_s']:.3f} s, {same}/{n} answers = cold")
            else:
                row = not_run(name, "unknown row")
        except Exception as e:
            tail = traceback.format_exception_only(type(e), e)[-1].strip()
            row = not_run(name, tail.splitlines()[0][:600])
        if row.get("ran"):
            row["tokens_match_cold"] = row["tokens"] == reference
            row["requests_equal_to_cold"] = sum(a == b for k in KINDS for a, b in zip(row["tokens"][k], reference[k]))
        report["rows"].append(row)
    upper = next((r for r in report["rows"] if r["row"] == "vllm-prefix-cache" and r.get("ran")), None)
    for row in report["rows"]:
        if row.get("ran") and upper is not None:
            row["requests_equal_to_prefix_cache"] = sum(
                a == b for k in KINDS for a, b in zip(row["tokens"][k], upper["tokens"][k]))

    n_requests = sum(len(prompts[k]) for k in KINDS)
    report["config"]["b_requests"] = n_requests
    cold_p50 = report["rows"][0]["ttft_p50_s"]
    for row in report["rows"]:
        if row.get("ran"):
            row["ttft_p50_over_cold"] = row["ttft_p50_s"] / cold_p50
            row["by_kind_over_cold"] = {k: row["ttft_p50_by_kind_s"][k] / report["rows"][0]["ttft_p50_by_kind_s"][k]
                                        for k in KINDS}
    for row in report["rows"]:
        row.pop("tokens", None)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    md = ["| row | TTFT p50 (s) | × cold | repeat × cold | new-user × cold | next-turn × cold | prefill tok/s | answers = cold |",
          "|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        if row.get("ran"):
            k = row["by_kind_over_cold"]
            md.append(f"| {row['row']} | {row['ttft_p50_s']:.3f} | {row['ttft_p50_over_cold']:.2f} | "
                      f"{k['repeat']:.2f} | {k['new-user']:.2f} | {k['next-turn']:.2f} | "
                      f"{row['prefill_tokens_per_s']:.0f} | {row.get('requests_equal_to_cold', n_requests)}/{n_requests} |")
        else:
            md.append(f"| {row['row']} | did not run: {row['why'].replace('|', '/')} | | | | | | |")
    if args.md:
        Path(args.md).write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"# {time.time() - t0:.0f} s", file=sys.stderr)
