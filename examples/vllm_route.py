"""A router's question about one vLLM request: from the prompt's token ids alone, the page keys
the engines' connectors use, which node holds the longest leading run of them, and the hint
that sends the request's reads there (docs/vllm.md shows this file).

    bash scripts/vllm-e2e.sh      # runs it in the vLLM venv (the keys are vLLM's own hashes)

Two nodes run in this process on loopback so the program runs anywhere. Node a stands for
engine A's worker: it publishes the pages under the keys its connector would use. In a
deployment the namespace is the one the engines' connectors log at start, and the question is
`POST /prefix` on any node's HTTP port (with its `http_token_file` token), which answers what
`prefix_locations` answers here.
"""

import random
import socket

from peercache.core import PageStore
from peercache.vllm.routing import RequestKeys

NAMESPACE = "vllm-0123456789abcdef"  # the engines' `layout vllm-...` start-up log line
BLOCK = 32                           # their --block-size


def free_port(ip: str) -> int:
    s = socket.socket()
    s.bind((ip, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def node(ip: str, seed: int) -> PageStore:
    return PageStore({
        "discovery_addr": f"127.0.0.1:{seed}", "protocol": "tcp", "local_hostname": ip,
        "rdma_bind_host": ip, "control_bind_host": ip, "meta_bind_host": ip,
        "global_segment_size": "64mb", "metrics_enabled": False,
    })


def main() -> None:
    seed = free_port("127.0.0.1")
    a = node("127.0.0.1", seed)
    b = node("127.0.0.2", seed)
    assert a.wait_members(2, 10) and b.wait_members(2, 10), "the nodes did not meet"

    rng = random.Random(7)
    system_prompt = [rng.randrange(1, 32000) for _ in range(8 * BLOCK)]
    served = system_prompt + [rng.randrange(1, 32000) for _ in range(40)]   # engine A served it
    incoming = system_prompt + [rng.randrange(1, 32000) for _ in range(70)]  # a new request

    keys = RequestKeys(NAMESPACE, BLOCK)
    published = keys.keys(served)  # 9 full blocks; A's connector published each as one page
    assert a.put_buffers(published, [bytes([i]) * 4096 for i in range(len(published))]) == [True] * 9

    # The router: the new request's keys, and who holds the longest leading run of them.
    wanted = keys.keys(incoming)  # 10 full blocks: the 8 of the system prompt, then its own
    runs = b.prefix_locations(wanted)
    assert runs and runs[0].node == a.node_id and runs[0].leading == 8, runs
    params = {"holder_node": runs[0].node}
    print(f"{len(wanted)} pages asked; {runs[0].node} holds the first {runs[0].leading}; "
          f"kv_transfer_params: {params}")
    b.close()
    a.close()


if __name__ == "__main__":
    main()
