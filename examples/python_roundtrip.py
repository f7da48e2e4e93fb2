"""Two PeerCache nodes in one Python process: store bytes on one, read them on the other.

    bash scripts/python.sh examples/python_roundtrip.py

(`scripts/python.sh` builds the wheel from this checkout into a cached virtualenv and runs
Python there; in a virtualenv of your own, `pip install maturin && maturin develop --release
-m peercache-py/Cargo.toml` once, then `python examples/python_roundtrip.py`.)
"""

import json
import socket

import peercache


def config(ip: str, port: int) -> str:
    return json.dumps({
        "discovery_addr": f"127.0.0.1:{port}", "protocol": "tcp",
        "local_hostname": ip, "rdma_bind_host": ip, "control_bind_host": ip, "meta_bind_host": ip,
        "global_segment_size": "64mb", "metrics_enabled": False,
    })


def main() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    a = peercache.Node(config("127.0.0.1", port))
    b = peercache.Node(config("127.0.0.2", port))
    a.wait_ready(10)
    b.wait_ready(10)
    assert a.wait_members(2, 10) and b.wait_members(2, 10)
    pages = [bytes([i]) * 65536 for i in range(4)]
    keys = [f"py-page-{i}" for i in range(4)]
    print("stored:", a.batch_set_buffers(keys, pages))
    print("leading pages present on the other node:", b.batch_exists(keys))
    out = [bytearray(65536) for _ in keys]
    print("read:", b.batch_get_buffers(keys, out), "byte-exact:", [bytes(o) for o in out] == pages)
    a.close()
    b.close()


if __name__ == "__main__":
    main()
