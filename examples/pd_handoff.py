"""A P/D hand-off from your own code: a decode-side `PeerCacheStore` waits for the prefix a
prefill rank is publishing, then reads it (docs/pd-handoff.md shows this file).

    bash scripts/python.sh examples/pd_handoff.py

Both ranks run in this process on loopback so the program runs anywhere; in a deployment the
prefill rank is another host and `discovery_addr` lists the cluster's seeds.
"""

import socket
import threading
import time

from peercache.store import PeerCacheStore


def settings(ip: str, port: int) -> dict:
    # Outside SGLang the settings are the constructor's `kwargs` (SGLang passes its extra
    # config). On real hosts: the seeds' addresses, and `cluster_secret_file` (or
    # PEERCACHE_CLUSTER_SECRET) on every rank.
    return {
        "discovery_addr": f"127.0.0.1:{port}", "protocol": "tcp",
        "local_hostname": ip, "rdma_bind_host": ip, "control_bind_host": ip, "meta_bind_host": ip,
        "global_segment_size": "64mb", "metrics_enabled": False,
    }


def main() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    prefill = PeerCacheStore(kwargs=settings("127.0.0.1", port))
    decode = PeerCacheStore(kwargs=settings("127.0.0.2", port))

    keys = [f"request-7-page-{i}" for i in range(8)]
    pages = [bytes([i]) * 65536 for i in range(8)]
    # The prefill rank publishes while the decode rank is already waiting for the prefix.
    publisher = threading.Thread(target=lambda: prefill.batch_set(keys, pages))
    t0 = time.monotonic()
    publisher.start()
    ready = decode.wait_for_full_prefix(keys, 5.0)  # leading keys present, within 5 s
    waited_ms = (time.monotonic() - t0) * 1000
    publisher.join()

    out = decode.batch_get(keys[:ready], [bytearray(65536) for _ in range(ready)])
    assert ready == len(keys), f"only {ready} of {len(keys)} pages arrived"
    assert [bytes(o) for o in out] == pages, "a page read back differs"
    print(f"decode saw {ready}/{len(keys)} pages within {waited_ms:.0f} ms and read them byte-exact")
    decode.close()
    prefill.close()


if __name__ == "__main__":
    main()
