"""Real vLLM engines and a PeerCache discovery server as child processes, for the end-to-end
tests and the benchmark: each engine is ``engine.py`` in its own process group, driven by JSON
lines, every wait bounded by a deadline."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent


def free_port(host: str = "127.0.0.1") -> int:
    s = socket.socket()
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def prompts_sharing(prefix_tokens: int, suffix_tokens: int, count: int, seed: int, vocab: int = 4000) -> List[List[int]]:
    """``count`` prompts that share one random prefix of ``prefix_tokens`` and differ after it."""
    rng = random.Random(seed)
    prefix = [rng.randrange(1, vocab) for _ in range(prefix_tokens)]
    return [prefix + [rng.randrange(1, vocab) for _ in range(suffix_tokens)] for _ in range(count)]


class Meta:
    """A standalone discovery server (``peercache-meta``) on ``host``."""

    def __init__(self, host: str, secret_file: str) -> None:
        self.addr = f"{host}:{free_port(host)}"
        self.proc = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "peercache-meta"), "--bind", self.addr,
             "--cluster-secret-file", secret_file],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        host_, port = self.addr.split(":")
        until = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((host_, int(port)), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > until or self.proc.poll() is not None:
                    raise RuntimeError(f"peercache-meta never listened on {self.addr}")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


class Engine:
    """One vLLM engine process (``engine.py``)."""

    def __init__(self, name: str, spec: Dict[str, object], log_dir: str, env: Optional[Dict[str, str]] = None) -> None:
        self.name = name
        fd, self.spec_path = tempfile.mkstemp(prefix=f"{name}-", suffix=".json", dir=log_dir)
        with os.fdopen(fd, "w") as f:
            json.dump(spec, f)
        self.log_path = os.path.join(log_dir, f"{name}.log")
        r, w = os.pipe()
        self._results = os.fdopen(r, "r")
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "engine.py"), self.spec_path, str(w)],
            stdin=subprocess.PIPE, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,
            pass_fds=(w,), start_new_session=True, text=True, env={**os.environ, **(env or {})})
        os.close(w)
        self.start_s: Optional[float] = None

    def _answer(self, timeout: float) -> Dict[str, object]:
        ready, _, _ = select.select([self._results], [], [], timeout)
        line = self._results.readline() if ready else ""
        if not line:
            tail = Path(self.log_path).read_text()[-3000:]
            raise RuntimeError(f"engine {self.name}: no answer within {timeout} s "
                               f"(exit {self.proc.poll()}); log tail:\n{tail}")
        out: Dict[str, object] = json.loads(line)
        if "error" in out:
            raise RuntimeError(f"engine {self.name} did not start: {self.root_cause() or out['error']}")
        return out

    def ready(self, timeout: float = 240) -> float:
        """Waits until the engine has started; its start time in seconds."""
        self.start_s = float(self._answer(timeout)["ready"])  # type: ignore[arg-type]
        return self.start_s

    def run(self, prompts: List[List[int]], max_tokens: int = 8, answer: bool = True, timeout: float = 300,
            params: Optional[List[Optional[Dict[str, object]]]] = None) -> Dict[str, object]:
        """Answers ``prompts`` (see ``engine.py``); ``params``: each prompt's
        ``kv_transfer_params``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"run": prompts, "max_tokens": max_tokens, "answer": answer,
                                          "params": params}) + "\n")
        self.proc.stdin.flush()
        return self._answer(timeout)

    def node(self, timeout: float = 30) -> Dict[str, float]:
        """The node's counters now."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"node": True}) + "\n")
        self.proc.stdin.flush()
        return self._answer(timeout)["node"]  # type: ignore[return-value]

    def log(self) -> str:
        return Path(self.log_path).read_text()

    def root_cause(self) -> Optional[str]:
        """The first error line of the engine's log that names a cause (vLLM's worker errors
        end in a generic "Engine core initialization failed")."""
        import re  # noqa: PLC0415

        for line in self.log().splitlines():
            m = re.search(r"\b([A-Z]\w*(?:Error|Exception)): (.+)$", line)
            if m and "Tokenizer" not in line and "initialization failed" not in line:
                return f"{m.group(1)}: {m.group(2).strip()}"[:400]
        return None

    def kill(self) -> None:
        """SIGKILL to the engine and every process it started."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Ends the engine: EOF on its commands, then its process group."""
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def connector(host: str, meta: str, secret: str, metrics_port: int, **extra: object) -> Dict[str, object]:
    """A ``kv_transfer_config`` for ``PeerCacheConnector`` with its node on ``host``."""
    cfg: Dict[str, object] = {"discovery_addr": meta, "local_hostname": host, "protocol": "tcp",
                              "global_segment_size": "1gb", "metrics_port": metrics_port,
                              "cluster_secret": secret, "op_timeout": 2.0, "startup_timeout": 20,
                              "heartbeat_interval": 0.2, "member_ttl": 1.0}
    cfg.update(extra)
    return {"kv_connector": "PeerCacheConnector", "kv_connector_module_path": "peercache.vllm",
            "kv_role": "kv_both", "kv_connector_extra_config": cfg}
