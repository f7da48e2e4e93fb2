"""The GPU check's steps after the wheels are installed (scripts/gpu-check.sh runs it on a CUDA
host; ``--device cpu --quick`` runs the same code here, small, to try it before a device run):

1. the direct-linker tests (peercache-py/tests/sglang/test_linker.py) with SGLang's pools on
   the device: every case's outcome;
2. the linker's staged path: pages/s and GB/s of an offload from and a load into SGLang device
   pools, beside plain torch pinned-host copies of the same bytes in the same run (the
   ceilings), and the loaded pages compared byte for byte;
3. the vLLM connector's host mirror (``peercache.vllm.staging``): a gather from and a scatter
   into vLLM-layout device caches, and a staged load (node read + scatter) byte-exact, beside
   the same ceilings;
4. registering a large host region in chunks: touching it, pinning it (``cudaHostRegister``),
   registering it with a node, and ``cudaHostAlloc``'s pinned allocation, in seconds per GB.

Writes ``gpu-check.json`` and ``gpu-check.md`` under ``--out``; exits 1 when a step failed or a
page was not byte-exact. A step that cannot run (SGLang does not import, say) is recorded with
its error and the others still run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from peercache.core import ConfigValue

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "peercache-py" / "tests" / "sglang"
GB = 1e9
NODE_COUNTERS = ("pool_pages", "pool_evictions", "members", "verify_rejects", "layout_mismatches",
                 "staged_reads", "directory_rpcs", "directory_local_calls")
Json = Union[None, bool, int, float, str, List["Json"], Dict[str, "Json"]]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(device: str, fn: Callable[[], object], reps: int) -> float:
    """The median seconds of ``reps`` calls of ``fn`` (after one warm-up), synchronized."""
    fn()
    sync(device)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def ceilings(device: str, nbytes: int, reps: int) -> Dict[str, float]:
    """GB/s of plain copies of ``nbytes`` between pinned host memory and the device (on CPU:
    between two host buffers), the figures a staged path is compared with."""
    pinned = device == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    host.random_()
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    h2d = timed(device, lambda: dev.copy_(host, non_blocking=pinned), reps)
    d2h = timed(device, lambda: host.copy_(dev, non_blocking=pinned), reps)
    return {"h2d_gbps": nbytes / h2d / GB, "d2h_gbps": nbytes / d2h / GB}


def node_config(n: int, **extra: ConfigValue) -> Dict[str, ConfigValue]:
    host = f"127.0.0.{n}"
    cfg: Dict[str, ConfigValue] = {
        "discovery_addr": f"{host}:{free_port()}", "protocol": "tcp", "local_hostname": host,
        "rdma_bind_host": host, "control_bind_host": host, "meta_bind_host": host,
        "metrics_enabled": False, "startup_timeout": 10, "op_timeout": 10.0}
    cfg.update(extra)
    return cfg


def free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----- 0. where it ran -----
def environment(device: str) -> Dict[str, Json]:
    env: Dict[str, Json] = {"python": platform.python_version(), "torch": torch.__version__,
                            "torch_cuda": torch.version.cuda, "device": device, "host_cpus": os.cpu_count()}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
    for dist in ("peercache", "sglang", "transformers", "numpy"):
        try:
            import importlib.metadata as md  # noqa: PLC0415

            env[dist] = md.version(dist)
        except Exception as e:  # noqa: BLE001
            env[dist] = f"missing: {e}"
    try:
        import sgl_kernel  # noqa: PLC0415

        env["sgl_kernel"] = "import stand-in (scripts/gpu-shims)" if getattr(sgl_kernel, "STAND_IN", False) else "installed"
    except ImportError:
        env["sgl_kernel"] = "absent"
    return env


# ----- 1. the linker tests -----
def linker_tests(device: str, out: Path, timeout: float) -> Dict[str, Json]:
    xml = out / "linker-tests.xml"
    env = dict(os.environ, PEERCACHE_LINKER_DEVICE=device)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / "test_linker.py"),
           f"--junitxml={xml}"]
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        rc: Optional[int] = proc.returncode
        tail = (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = None, f"timed out after {timeout:.0f} s: {str(e.stdout or '')[-2000:]}"
    (out / "linker-tests.log").write_text(tail)
    cases: List[Json] = []
    if xml.exists():
        for case in ET.parse(xml).iter("testcase"):
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    message = (el.get("message") or el.text or "").strip().splitlines()[0][:300] if (
                        el.get("message") or el.text) else ""
            cases.append({"name": case.get("name"), "outcome": outcome, "message": message})
    counts = {k: sum(1 for c in cases if isinstance(c, dict) and c["outcome"] == k)
              for k in ("passed", "failed", "error", "skipped")}
    return {"rc": rc, **counts, "cases": cases, "tail": tail[-600:] if rc not in (0,) else ""}


# ----- 2. the linker's staged path -----
def linker_staged(device: str, quick: bool, reps: int) -> Dict[str, Json]:
    os.environ["PEERCACHE_LINKER_DEVICE"] = device
    sys.path.insert(0, str(TESTS))
    import test_linker as T  # type: ignore[import-not-found]  # noqa: PLC0415
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: PLC0415
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context  # noqa: PLC0415
    from sglang.srt.server_args import ServerArgs  # noqa: PLC0415

    layers, heads, dim, page, pages = (4, 2, 64, 64, 16) if quick else (32, 8, 128, 64, 128)
    model = Path(tempfile.mkdtemp(prefix="gpu-check-model-"))
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": heads * dim,
        "intermediate_size": 4 * heads * dim, "num_attention_heads": heads, "num_hidden_layers": layers,
        "num_key_value_heads": heads, "vocab_size": 128, "max_position_embeddings": 4096,
        "torch_dtype": "float16"}))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = ServerArgs(model_path=str(model), skip_tokenizer_init=True, device=device)
    reset_context()
    publish(args, role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))
    pool = MHATokenToKVPool(size=2 * pages * page, page_size=page, dtype=torch.float16, head_num=heads,
                            head_dim=dim, layer_num=layers, device=device, enable_memory_saver=False)
    for t in T.buffers(pool):
        t.view(torch.uint8).random_()
    page_bytes = sum(t[0:page].nbytes for t in T.buffers(pool))
    nbytes = pages * page_bytes
    segment = (reps + 2) * nbytes + (64 << 20)
    port = free_port()
    # Production timings, not the tests' fast ones: a 1 GiB batch on a loaded host must not
    # outlast the membership of its own node (the tests' member_ttl is 0.6 s).
    linker = T.build(args, pool, 97, 97, port, global_segment_size=str(segment), heartbeat_interval=1.0,
                     member_ttl=10.0, op_timeout=10.0,
                     linker_staging="always" if device == "cpu" else "auto")
    try:
        assert linker.staging, "the linker does not stage: the pools are not device pools"
        src, dst = T.slots(0, pages, page), T.slots(pages, pages, page)
        offload_s: List[float] = []
        load_s: List[float] = []
        exact = True
        for rep in range(reps + 1):  # the first of each is a warm-up
            keys = [f"gpu-check-{rep}-{i}" for i in range(pages)]
            t0 = time.perf_counter()
            assert linker.offload(T.kv(keys, src))
            deadline = t0 + 120
            while linker.num_completed_offloads() < 1:
                assert time.perf_counter() < deadline, "the offload did not complete in 120 s"
                time.sleep(0.0002)
            dt = time.perf_counter() - t0
            assert linker.pop_completed_offload() is True, "the offload failed"
            for t in T.buffers(pool):  # poison the destination: every byte must be written
                T.rows(pool, t, dst).view(torch.uint8).fill_(0xA5)
            sync(device)
            t0 = time.perf_counter()
            ok = T.load_all(linker, f"gpu-check-r{rep}", keys, dst)
            sync(device)
            lt = time.perf_counter() - t0
            exact = exact and ok is True and T.same_pages(pool, src, pool, dst)
            if rep:
                offload_s.append(dt)
                load_s.append(lt)
        node = linker.store.core.stats()
    finally:
        linker.close()
        reset_context()
    ceil = ceilings(device, nbytes, max(reps, 5))
    off, load = statistics.median(offload_s), statistics.median(load_s)
    return {"pool": f"MHA fp16, {layers} layers x {heads} heads x {dim}, page {page} tokens",
            "pages": pages, "page_bytes": page_bytes, "bytes": nbytes, "byte_exact": exact,
            "offload_s": off, "offload_pages_per_s": pages / off, "offload_gbps": nbytes / off / GB,
            "load_s": load, "load_pages_per_s": pages / load, "load_gbps": nbytes / load / GB,
            **ceil, "load_vs_h2d": nbytes / load / GB / ceil["h2d_gbps"],
            "offload_vs_d2h": nbytes / off / GB / ceil["d2h_gbps"],
            # Why a page did not land, if one did not: the node's own counters.
            "node": {k: v for k, v in node.items() if k in NODE_COUNTERS and isinstance(v, int)}}


# ----- 3. the vLLM host mirror -----
def vllm_staged(device: str, quick: bool, reps: int) -> Dict[str, Json]:
    from peercache.core import PageStore  # noqa: PLC0415
    from peercache.vllm.staging import HostMirror  # noqa: PLC0415

    layers, blocks, bs, heads, dim, n = (4, 64, 16, 2, 64, 16) if quick else (32, 1024, 16, 8, 128, 256)
    # vLLM's CUDA layout: [2 (K, V), blocks, block size, KV heads, head size] per layer.
    caches = {f"model.layers.{i}.self_attn.attn": torch.empty((2, blocks, bs, heads, dim), dtype=torch.float16,
                                                             device=device) for i in range(layers)}
    for t in caches.values():
        t.view(torch.uint8).random_()
    mirror = HostMirror(caches, blocks, n)
    nbytes = n * mirror.table.block_bytes
    store = PageStore(node_config(98, global_segment_size=str((reps + 2) * nbytes + (64 << 20))))
    try:
        assert store.wait_ready(10), "the node did not start"
        for ptr, size in mirror.storages():
            store.register_host(ptr, size)
        slots = mirror.take(n, 1.0)
        src, dst = list(range(n)), list(range(n, 2 * n))
        gather = timed(device, lambda: mirror.gather(src, slots), reps)
        scatter = timed(device, lambda: mirror.scatter(slots, dst), reps)
        put_s: List[float] = []
        get_s: List[float] = []
        load_s: List[float] = []
        exact = True
        for rep in range(reps + 1):
            keys = [f"gpu-check-vllm-{rep}-{i}" for i in range(n)]
            mirror.gather(src, slots)
            t0 = time.perf_counter()
            assert all(store.put(keys, mirror.segments(slots))), "a page was not published"
            pt = time.perf_counter() - t0
            for t in mirror.host.values():
                t.view(torch.uint8).fill_(0x5A)  # type: ignore[attr-defined]
            for t in caches.values():
                t[:, n:2 * n].view(torch.uint8).fill_(0xA5)
            sync(device)
            t0 = time.perf_counter()
            got = store.get(keys, mirror.segments(slots))
            gt = time.perf_counter() - t0
            mirror.scatter(slots, dst)
            lt = time.perf_counter() - t0
            exact = exact and all(got) and all(
                torch.equal(t[:, :n].view(torch.uint8), t[:, n:2 * n].view(torch.uint8)) for t in caches.values())
            if rep:
                put_s.append(pt)
                get_s.append(gt)
                load_s.append(lt)
        mirror.give(slots)
    finally:
        store.close()
    ceil = ceilings(device, nbytes, max(reps, 5))
    load = statistics.median(load_s)
    return {"caches": f"fp16 [2, {blocks}, {bs}, {heads}, {dim}] x {layers} layers", "blocks": n,
            "page_bytes": mirror.table.block_bytes, "bytes": nbytes, "byte_exact": exact,
            "gather_gbps": nbytes / gather / GB, "scatter_gbps": nbytes / scatter / GB,
            "node_put_gbps": nbytes / statistics.median(put_s) / GB,
            "node_get_gbps": nbytes / statistics.median(get_s) / GB,
            "staged_load_s": load, "staged_load_gbps": nbytes / load / GB, **ceil,
            "scatter_vs_h2d": nbytes / scatter / GB / ceil["h2d_gbps"],
            "gather_vs_d2h": nbytes / gather / GB / ceil["d2h_gbps"],
            "staged_load_vs_h2d": nbytes / load / GB / ceil["h2d_gbps"]}


# ----- 4. registering a large region -----
def registration(device: str, quick: bool) -> Dict[str, Json]:
    from peercache.core import PageStore  # noqa: PLC0415

    total, chunk = ((1 << 30), (256 << 20)) if quick else ((16 << 30), (1 << 30))
    buf = torch.empty(total, dtype=torch.uint8)
    t0 = time.perf_counter()
    buf.fill_(1)  # first touch: the pages exist before they are pinned
    touch = time.perf_counter() - t0
    base = buf.data_ptr()
    out: Dict[str, Json] = {"bytes": total, "chunk_bytes": chunk, "touch_s_per_gb": touch / (total / GB)}
    if device == "cuda":
        cudart = torch.cuda.cudart()
        t0 = time.perf_counter()
        for off in range(0, total, chunk):
            rc = cudart.cudaHostRegister(base + off, chunk, 0)
            assert int(rc) == 0, f"cudaHostRegister returned {rc}"
        out["cuda_host_register_s_per_gb"] = (time.perf_counter() - t0) / (total / GB)
    store = PageStore(node_config(99, global_segment_size="64mb"))
    try:
        assert store.wait_ready(10), "the node did not start"
        t0 = time.perf_counter()
        for off in range(0, total, chunk):
            store.register_host(base + off, chunk)
        out["node_register_s_per_gb"] = (time.perf_counter() - t0) / (total / GB)
    finally:
        store.close()
    if device == "cuda":
        t0 = time.perf_counter()
        for off in range(0, total, chunk):
            cudart.cudaHostUnregister(base + off)
        out["cuda_host_unregister_s_per_gb"] = (time.perf_counter() - t0) / (total / GB)
        del buf
        t0 = time.perf_counter()
        pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
        out["cuda_host_alloc_s_per_gb"] = (time.perf_counter() - t0) / (total / GB)
        del pinned
    return out


def run_step(name: str, fn: Callable[[], Dict[str, Json]]) -> Dict[str, Json]:
    t0 = time.perf_counter()
    print(f"gpu-check: {name} ...", flush=True)
    try:
        res = fn()
        res["ok"] = True
    except BaseException as e:  # noqa: BLE001 - a step that cannot run is recorded, the rest go on
        if isinstance(e, KeyboardInterrupt):
            raise
        where: List[Json] = [*traceback.format_exc().strip().splitlines()[-3:]]
        res = {"ok": False, "error": f"{type(e).__name__}: {e}"[:1000], "where": where}
    res["seconds"] = round(time.perf_counter() - t0, 2)
    said = res["error"] if not res["ok"] else (
        f"{res['passed']} passed, {res['failed']} failed, {res['error']} errors" if "passed" in res else "ok")
    print(f"gpu-check: {name}: {said} ({res['seconds']} s)", flush=True)
    return res


def fmt(x: Json, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def markdown(report: Mapping[str, Json]) -> str:
    env = report["environment"]
    assert isinstance(env, dict)
    lines = [f"# PeerCache GPU check, {report['date']}", "",
             f"`{report['command']}` on {env.get('gpu', env.get('device'))}: Python {env['python']}, "
             f"torch {env['torch']} (CUDA {env['torch_cuda']}), SGLang {env['sglang']}, sgl_kernel "
             f"{env['sgl_kernel']}.", ""]
    tests = report["linker_tests"]
    assert isinstance(tests, dict)
    lines += ["## Direct-linker tests", "",
              f"{tests.get('passed')} passed, {tests.get('failed')} failed, {tests.get('error')} errors, "
              f"{tests.get('skipped')} skipped (rc {tests.get('rc')}).", ""]
    cases = tests.get("cases")
    for c in cases if isinstance(cases, list) else []:
        if isinstance(c, dict) and c["outcome"] != "passed":
            lines.append(f"- {c['name']}: {c['outcome']}: {c['message']}")
    lines += ["", "## Staged paths (GB/s; the ceilings are plain pinned copies of the same bytes, same run)", "",
              "| path | rate | ceiling | ratio | byte-exact |", "|---|---:|---:|---:|---|"]
    ls, vs = report["linker_staged"], report["vllm_staged"]
    assert isinstance(ls, dict) and isinstance(vs, dict)
    if ls.get("ok"):
        lines.append(f"| linker load into device pools ({fmt(ls['load_pages_per_s'], 0)} pages/s) | "
                     f"{fmt(ls['load_gbps'])} | {fmt(ls['h2d_gbps'])} H2D | {fmt(ls['load_vs_h2d'])} | {ls['byte_exact']} |")
        lines.append(f"| linker offload from device pools ({fmt(ls['offload_pages_per_s'], 0)} pages/s) | "
                     f"{fmt(ls['offload_gbps'])} | {fmt(ls['d2h_gbps'])} D2H | {fmt(ls['offload_vs_d2h'])} | |")
    else:
        lines.append(f"| linker | did not run: {ls.get('error')} | | | |")
    if vs.get("ok"):
        lines.append(f"| vLLM mirror scatter | {fmt(vs['scatter_gbps'])} | {fmt(vs['h2d_gbps'])} H2D | "
                     f"{fmt(vs['scatter_vs_h2d'])} | |")
        lines.append(f"| vLLM mirror gather | {fmt(vs['gather_gbps'])} | {fmt(vs['d2h_gbps'])} D2H | "
                     f"{fmt(vs['gather_vs_d2h'])} | |")
        lines.append(f"| node read into the mirror (host to host) | {fmt(vs['node_get_gbps'])} | | | |")
        lines.append(f"| vLLM staged load (node read + scatter) | {fmt(vs['staged_load_gbps'])} | "
                     f"{fmt(vs['h2d_gbps'])} H2D | {fmt(vs['staged_load_vs_h2d'])} | {vs['byte_exact']} |")
    else:
        lines.append(f"| vLLM mirror | did not run: {vs.get('error')} | | | |")
    reg = report["registration"]
    assert isinstance(reg, dict)
    lines += ["", "## Registering a large host region (seconds per GB)", ""]
    if reg.get("ok"):
        lines.append(f"{fmt(reg['bytes'] / GB if isinstance(reg['bytes'], int) else 0, 1)} GB in chunks of "
                     f"{fmt(reg['chunk_bytes'] / GB if isinstance(reg['chunk_bytes'], int) else 0, 2)} GB:")
        lines.append("")
        for k in ("touch_s_per_gb", "cuda_host_register_s_per_gb", "node_register_s_per_gb",
                  "cuda_host_unregister_s_per_gb", "cuda_host_alloc_s_per_gb"):
            if k in reg:
                lines.append(f"- {k}: {fmt(reg[k], 4)}")
    else:
        lines.append(f"did not run: {reg.get('error')}")
    lines += ["", f"Verdict: {json.dumps(report['verdict'])}", ""]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true", help="small sizes (a try on CPU)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tests-timeout", type=float, default=240.0)
    ap.add_argument("--no-linker-tests", action="store_true",
                    help="skip step 1 (CI's sglang stage has just run those tests on CPU)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report: Dict[str, Json] = {
        "date": time.strftime("%Y-%m-%d"), "command": "bash scripts/gpu-check.sh",
        "environment": environment(args.device)}
    if args.no_linker_tests:
        report["linker_tests"] = {"ok": True, "rc": 0, "skipped_by": "--no-linker-tests", "cases": []}
    else:
        report["linker_tests"] = run_step("linker tests",
                                          lambda: linker_tests(args.device, args.out, args.tests_timeout))
    report["linker_staged"] = run_step("linker staged path", lambda: linker_staged(args.device, args.quick, args.reps))
    report["vllm_staged"] = run_step("vLLM host mirror", lambda: vllm_staged(args.device, args.quick, args.reps))
    report["registration"] = run_step("registration", lambda: registration(args.device, args.quick))
    tests, ls, vs = report["linker_tests"], report["linker_staged"], report["vllm_staged"]
    assert isinstance(tests, dict) and isinstance(ls, dict) and isinstance(vs, dict)
    verdict: Dict[str, Json] = {
        "linker_tests_pass": tests.get("rc") == 0,
        "byte_exact": bool(ls.get("byte_exact")) and bool(vs.get("byte_exact")),
        "linker_load_vs_h2d": ls.get("load_vs_h2d"),
        "linker_load_at_least_0_7_of_h2d": isinstance(ls.get("load_vs_h2d"), float) and float(ls["load_vs_h2d"]) >= 0.7,  # type: ignore[arg-type]
    }
    report["verdict"] = verdict
    (args.out / "gpu-check.json").write_text(json.dumps(report, indent=2) + "\n")
    md = markdown(report)
    (args.out / "gpu-check.md").write_text(md)
    print(md)
    failed = [k for k in ("linker_tests", "linker_staged", "vllm_staged", "registration")
              if not (report[k] or {}).get("ok")]  # type: ignore[union-attr]
    return 0 if not failed and verdict["linker_tests_pass"] and verdict["byte_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
