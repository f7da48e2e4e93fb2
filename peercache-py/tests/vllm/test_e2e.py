"""PeerCache inside real vLLM engines serving a real (locally generated) model, end to end:
engine A publishes what it computed, engine B on another node loads the shared prefixes from
it and answers with the same greedy tokens as a cold engine; with A's node killed, B still
answers identically (it recomputes) within the deadline. A router subscribed to A's own KV-event
stream hears every block A published to the cluster, as vLLM ``BlockStored`` events with their
tokens and parents. A router that knows only a prompt's token ids computes its page keys
(``peercache.vllm.routing``), asks a node which node holds them (``POST /prefix``) and sends the
request with that node as its hint: B loads from it without asking the directory, and with a
wrong hint still answers identically. Run by the `vllm` CI stage (scripts/vllm-e2e.sh)."""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import time
import urllib.request

import pytest

# `vllm.config`, not `vllm`: without vLLM installed, this folder itself imports as a namespace
# package named `vllm`.
pytest.importorskip("torch", reason="the vLLM venv (scripts/vllm-e2e.sh)")
pytest.importorskip("vllm.config", reason="the vLLM venv (scripts/vllm-e2e.sh)")

from harness import Engine, Meta, connector, free_port, prompts_sharing
from model import make_model

from peercache.vllm.routing import RequestKeys

BLOCK = 32
PREFIX = int(os.environ.get("PC_VLLM_PREFIX", "2048"))  # shared prefix tokens (64 blocks)
LAYERS = int(os.environ.get("PC_VLLM_LAYERS", "4"))
# float32: in bfloat16 a random-weight model's near-tie logits flip between a cold prefill and
# one over reused KV even with vLLM's own prefix cache (scripts/vllm-bench.py --dtype).
DTYPE = os.environ.get("PC_VLLM_DTYPE", "float32")
HIDDEN = int(os.environ.get("PC_VLLM_HIDDEN", "512"))


@pytest.fixture(scope="module")
def workdir():
    keep = os.environ.get("PC_VLLM_LOGS")  # keep the engines' logs there
    if keep:
        os.makedirs(keep, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="pc-vllm-") as d:
        yield d


@pytest.fixture(scope="module")
def model(workdir):
    return make_model(os.path.join(workdir, "model"), layers=LAYERS, hidden=HIDDEN)


@pytest.fixture(scope="module")
def secret(workdir):
    value = secrets.token_hex(16)
    path = os.path.join(workdir, "secret")
    with open(path, "w") as f:
        f.write(value)
    os.chmod(path, 0o600)
    return value, path


def test_engine_b_loads_engine_a_prefixes_and_answers_identically_even_with_a_dead(workdir, model, secret):
    value, path = secret
    meta = Meta("127.0.0.10", path)
    # A 2,132-token prompt: 66 full blocks and a 20-token tail, which B loads too.
    shared = prompts_sharing(PREFIX, 84, 3, seed=1)       # A answers these cold and publishes
    variants = prompts_sharing(PREFIX, 84, 6, seed=1)[3:]  # same prefix, other suffixes
    after_kill = prompts_sharing(PREFIX, 84, 9, seed=1)[6:]
    routed = prompts_sharing(PREFIX, 84, 11, seed=1)[9:]  # sent by the router, with a hint
    token_file = os.path.join(workdir, "router-token")
    with open(token_file, "w") as f:
        f.write(secrets.token_hex(16))
    os.chmod(token_file, 0o600)
    m_a, m_b = free_port("127.0.0.11"), free_port("127.0.0.12")
    events_port = free_port("127.0.0.11")
    engines = []
    router = None
    try:
        # A logs at INFO: its connector's start-up line names the key namespace a router needs.
        a = Engine("a", {"model": model, "dtype": DTYPE, "metrics": f"127.0.0.11:{m_a}", "kv_events": f"tcp://*:{events_port}",
                         "kv": connector("127.0.0.11", meta.addr, value, m_a, node_id="engine-a")}, workdir,
                   env={"VLLM_LOGGING_LEVEL": "INFO"})
        ref = Engine("b-off", {"model": model, "dtype": DTYPE, "kv": None}, workdir)
        b = Engine("b", {"model": model, "dtype": DTYPE, "metrics": f"127.0.0.12:{m_b}",
                         "kv": connector("127.0.0.12", meta.addr, value, m_b, node_id="engine-b",
                                         http_token_file=token_file)}, workdir)
        engines = [a, ref, b]
        for e in engines:
            e.ready()
        # vLLM's publisher binds (``tcp://*:port``, its default form); the router connects.
        router = EngineEvents(f"tcp://127.0.0.11:{events_port}")
        cold = a.run(shared)
        assert a.node()["peercache_pool_published_total"] > 0, "A published nothing"
        # Every full block of A's prompts, announced on A's own event stream once stored, with
        # its tokens, chained to its parent as vLLM chains blocks.
        blocks = {tuple(ids[i * BLOCK:(i + 1) * BLOCK]) for ids in shared for i in range(len(ids) // BLOCK)}
        router.until(lambda: blocks <= router.by_tokens.keys(), 30)
        for ids in shared:
            chain = [router.by_tokens[tuple(ids[i * BLOCK:(i + 1) * BLOCK])] for i in range(len(ids) // BLOCK)]
            assert chain[0].parent_block_hash is None
            for prev, ev in zip(chain, chain[1:]):
                assert ev.parent_block_hash == prev.block_hashes[0]
            assert all((ev.medium, ev.block_size) == ("cpu", BLOCK) for ev in chain)
        expect = ref.run(shared + variants + after_kill + routed)
        assert cold["tokens"] == expect["tokens"][:3], "A's tokens with the connector differ from a cold engine's"

        before = b.node()
        got = b.run(shared + variants, answer=True)
        after = got["node"]
        assert got["tokens"] == expect["tokens"][:6], "B's tokens differ from a cold engine's"
        # Each prompt's first request loads its prefix from A's node: the shared blocks are
        # PREFIX / BLOCK per prompt.
        remote = after["peercache_read_remote_hits_total"] - before["peercache_read_remote_hits_total"]
        wanted = len(shared + variants) * (PREFIX // BLOCK)
        assert remote >= 0.9 * wanted, f"B loaded {remote:.0f} of {wanted} shared prefix blocks from A"
        assert "not loaded" not in b.log()

        # The router: each routed prompt's page keys from its token ids alone (vLLM's own block
        # hashing under the namespace A's connector logged), asked of B's node over HTTP.
        ns = re.search(r"layout (vllm-[0-9a-f]{16})", a.log())
        assert ns, "A's connector logged no layout line at INFO"
        keys = RequestKeys(ns.group(1), BLOCK)
        for ids in routed:
            runs = prefix_query(f"127.0.0.12:{m_b}", token_file, keys.keys(ids))
            assert runs and runs[0]["node"] == "engine-a-r0", runs
            assert runs[0]["leading"] == PREFIX // BLOCK, runs  # the shared prefix; the rest is new
        # Sent to B with A's node as the hint: B's node reads A's blocks from A, no directory
        # lookup for them (each a hint hit; only the prompt's own new blocks, which A never held,
        # are misses); then a wrong hint (B's own node, which holds none of the prefix): each
        # prefix block a hint miss, found through the directory instead.
        right = b.run(routed[:1], params=[{"holder_node": runs[0]["node"]}])
        wrong = b.run(routed[1:], params=[{"holder_node": "engine-b-r0"}])
        assert right["tokens"] + wrong["tokens"] == expect["tokens"][9:11], "a hint changed B's tokens"
        counted = [(r["node"]["peercache_read_hint_hits_total"] - was["peercache_read_hint_hits_total"],
                    r["node"]["peercache_read_hint_misses_total"] - was["peercache_read_hint_misses_total"],
                    r["node"]["peercache_read_remote_hits_total"] - was["peercache_read_remote_hits_total"])
                   for was, r in ((after, right), (right["node"], wrong))]
        for (hits, misses, remote_blocks), hint in zip(counted, ("right", "wrong")):
            assert remote_blocks >= PREFIX // BLOCK, (hint, counted)
            if hint == "right":
                assert hits >= PREFIX // BLOCK and 4 * misses < hits, (hint, counted)
            else:
                assert misses >= PREFIX // BLOCK and 4 * hits < misses, (hint, counted)

        a.kill()  # node 1 is gone; its directory entries outlive it for a while
        t0 = time.monotonic()
        late = b.run(after_kill, timeout=120)
        took = time.monotonic() - t0
        assert late["tokens"] == expect["tokens"][6:9], "B's tokens differ after A's node died"
        assert took < 60, f"B took {took:.1f} s with A's node dead"
        print(json.dumps({"start_s": [e.start_s for e in engines], "cold_ttft": cold["ttft_s"],
                          "b_ttft": got["ttft_s"], "after_kill_ttft": late["ttft_s"], "remote_blocks": remote,
                          "hinted_ttft": right["ttft_s"] + wrong["ttft_s"], "hint_counts": counted}))
    finally:
        if router is not None:
            router.close()
        for e in engines:
            e.stop()
        meta.stop()


def prefix_query(endpoint: str, token_file: str, keys: list) -> list:
    """``POST /prefix`` on a node's HTTP port with its bearer token: the nodes holding a leading
    run of ``keys``, longest first."""
    with open(token_file) as f:
        token = f.read().strip()
    req = urllib.request.Request(f"http://{endpoint}/prefix", data=json.dumps({"keys": keys}).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        answer = json.loads(r.read())
    assert answer["keys"] == len(keys), answer
    return answer["nodes"]


class EngineEvents:
    """A router on one engine's KV-event stream (vLLM's ZeroMQ publisher at ``endpoint``): the
    ``BlockStored`` events heard, by their blocks' tokens."""

    def __init__(self, endpoint: str) -> None:
        import msgspec  # noqa: PLC0415
        import zmq  # noqa: PLC0415
        from vllm.distributed.kv_events import KVEventBatch  # noqa: PLC0415

        self.zmq = zmq
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.by_tokens: dict = {}

    def until(self, cond, timeout: float) -> None:
        """Applies batches as they come until ``cond()`` holds (at most ``timeout`` s)."""
        from vllm.distributed.kv_events import BlockStored  # noqa: PLC0415

        deadline = time.monotonic() + timeout
        while not cond():
            left = deadline - time.monotonic()
            assert left > 0, f"{len(self.by_tokens)} blocks heard when the deadline passed"
            if self.sub.poll(int(min(left, 0.2) * 1000)):
                *_, payload = self.sub.recv_multipart()
                for ev in self.decoder.decode(payload).events:
                    if isinstance(ev, BlockStored):
                        self.by_tokens.setdefault(tuple(ev.token_ids), ev)

    def close(self) -> None:
        self.sub.close()
        self.ctx.term()
