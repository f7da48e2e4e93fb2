"""Mooncake Store on loopback TCP, driven the way `peercache-bench compare` drives PeerCache.

    python mooncake_peer.py server --master 127.0.0.1:P --metadata http://127.0.0.1:Q/metadata
        A storage process: contributes a segment and serves until stdin closes.
    python mooncake_peer.py client --master ... --metadata ... --page-bytes 131072 --batch 32
        --pages 2048 --threads 1 --seconds 0.5
        A pure client (no segment of its own, so every byte crosses the transfer engine): stores
        the working set once, then runs batched get_into calls into a registered buffer for the
        given time and prints one JSON line: pages/s and per-call latency percentiles.
    python mooncake_peer.py client --real-client 127.0.0.1:P ...
        The same loop as a "dummy" client of a `mooncake_client` process on this host (Mooncake's
        same-host path): its buffer lives in shared memory the real client maps, and the real
        client, which holds the pages in its own segment, copies them into it.
"""

import argparse
import ctypes
import json
import sys
import threading
import time

from mooncake.store import MooncakeDistributedStore


def connect(args, segment: int, local_buffer: int) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    rc = store.setup(args.host, args.metadata, segment, local_buffer, "tcp", "", args.master)
    if rc != 0:
        sys.exit(f"mooncake setup failed: {rc}")
    return store


def server(args) -> None:
    store = connect(args, args.segment_mib << 20, 16 << 20)
    print("READY", flush=True)
    sys.stdin.read()  # until the parent closes it
    store.close()


def client(args) -> None:
    page, batch = args.page_bytes, args.batch
    buf_len = page * batch * max(args.threads, 1)
    if args.real_client:
        store = MooncakeDistributedStore()
        if store.setup_dummy(max(2 * buf_len, 64 << 20), 64 << 20, args.real_client) != 0:
            sys.exit("mooncake setup_dummy failed")
        base = store.alloc_from_mem_pool(buf_len)
        if not base:
            sys.exit("alloc_from_mem_pool failed")
        buf = (ctypes.c_uint8 * buf_len).from_address(base)
    else:
        store = connect(args, 0, 16 << 20)
        buf = (ctypes.c_uint8 * buf_len)()
        base = ctypes.addressof(buf)
    if store.register_buffer(base, buf_len) != 0:
        sys.exit("register_buffer failed")
    keys = [f"mc-page-{i}" for i in range(args.pages)]
    if args.fill:
        for i in range(buf_len):
            buf[i] = (i * 131 + 7) & 0xFF
        for at in range(0, args.pages, batch):
            ks = keys[at:at + batch]
            rc = store.batch_put_from(ks, [base + j * page for j in range(len(ks))], [page] * len(ks))
            if any(r < 0 for r in rc):
                sys.exit(f"batch_put_from failed: {rc[:4]}")
    lat: list = []
    done = [0]
    errors = [0]
    lock = threading.Lock()
    stop = time.monotonic() + args.seconds

    def worker(t: int) -> None:
        my = base + t * page * batch
        ptrs = [my + j * page for j in range(batch)]
        sizes = [page] * batch
        k = t * 997
        local_lat, local_done, local_err = [], 0, 0
        while time.monotonic() < stop:
            ks = []
            for _ in range(batch):
                k = (k + 1) % args.pages
                ks.append(keys[k])
            t0 = time.perf_counter()
            rc = store.batch_get_into(ks, ptrs, sizes)
            local_lat.append(time.perf_counter() - t0)
            ok = sum(1 for r in rc if r == page)
            local_done += ok
            local_err += batch - ok
        with lock:
            lat.extend(local_lat)
            done[0] += local_done
            errors[0] += local_err

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(args.threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.monotonic() - t0
    lat.sort()
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e6 if lat else 0.0  # noqa: E731
    print(json.dumps({
        "pages_per_s": done[0] / wall, "calls": len(lat), "errors": errors[0],
        "p50_us": pct(0.50), "p99_us": pct(0.99), "max_us": lat[-1] * 1e6 if lat else 0.0,
    }), flush=True)
    store.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["server", "client"])
    p.add_argument("--master", required=True)
    p.add_argument("--metadata", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--segment-mib", type=int, default=1024)
    p.add_argument("--page-bytes", type=int, default=131072)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--pages", type=int, default=2048)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--fill", action="store_true")
    p.add_argument("--real-client", default="", help="host:port of a mooncake_client (dummy mode)")
    args = p.parse_args()
    server(args) if args.role == "server" else client(args)


if __name__ == "__main__":
    main()
