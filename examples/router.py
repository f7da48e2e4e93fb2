"""A router's picture of the cluster from the nodes' KV events alone: which node holds the
longest leading run of a request's pages, and the hint that sends the request's reads there
(docs/operations.md shows this file).

    bash scripts/vllm-e2e.sh      # runs it in the vLLM venv, which has pyzmq and msgspec

Two nodes run in this process on loopback so the program runs anywhere; in a deployment the
router lists every node's host and its `kv_events_port` / `kv_events_replay_port`.
"""

import socket
import time

from peercache.core import PageStore
from peercache.router import ClusterView, NodeEvents


def free_port(ip: str) -> int:
    s = socket.socket()
    s.bind((ip, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def node(ip: str, seed: int, events: int, replay: int) -> PageStore:
    return PageStore({
        "discovery_addr": f"127.0.0.1:{seed}", "protocol": "tcp", "local_hostname": ip,
        "rdma_bind_host": ip, "control_bind_host": ip, "meta_bind_host": ip,
        "global_segment_size": "64mb", "metrics_enabled": False,
        # The two ports a router follows, and the tokens per page its events announce.
        "kv_events_port": events, "kv_events_replay_port": replay, "kv_events_block_size": 16,
    })


def main() -> None:
    seed = free_port("127.0.0.1")
    ports = {ip: (free_port(ip), free_port(ip)) for ip in ("127.0.0.1", "127.0.0.2")}
    a = node("127.0.0.1", seed, *ports["127.0.0.1"])
    b = node("127.0.0.2", seed, *ports["127.0.0.2"])
    assert a.wait_members(2, 10) and b.wait_members(2, 10), "the nodes did not meet"

    # Node a publishes a request's eight pages.
    keys = [f"chat-42/page-{i}" for i in range(8)]
    assert a.put_buffers(keys, [bytes([i]) * 4096 for i in range(8)]) == [True] * 8

    view = ClusterView([NodeEvents(ip, ev, rp) for ip, (ev, rp) in ports.items()])
    deadline = time.monotonic() + 10
    while True:
        view.pump()
        runs = view.prefix(keys)
        if runs and runs[0].leading == len(keys):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"the events did not show the prefix within 10 s: {runs}")
        time.sleep(0.05)

    # The same answer the directory gives, and the hint a router adds to the request.
    assert runs == a.prefix_locations(keys), (runs, a.prefix_locations(keys))
    hint = view.hint(keys)
    assert hint == {"holder_node": a.node_id}, hint
    print(f"{runs[0].node} holds {runs[0].leading} leading pages ({runs[0].resident} in memory); "
          f"kv_transfer_params: {hint}")
    view.close()
    b.close()
    a.close()


if __name__ == "__main__":
    main()
