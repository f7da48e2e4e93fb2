#!/usr/bin/env python3
"""A three-node cluster watched the way operators watch it, by the real tools:

* Prometheus (Debian's package, run from its files on its own port, never the package's
  service) scrapes every node; every target must be `up`, and after a workload
  `rate(peercache_bytes_read_total[30s]) > 0` must answer through Prometheus' HTTP API, as
  must every query of docs/grafana-dashboard.json (each returns data: it names series the
  nodes export);
* `promtool check metrics` accepts every node's exposition;
* the embedded dashboard, loaded in headless Chromium through chromedriver (WebDriver), shows
  the three members and real numbers (hit rate, a chart with a non-zero point); a screenshot is
  saved (`--screenshot FILE`; docs/dashboard.png is refreshed with
  `bash scripts/observability.sh --screenshot docs/dashboard.png --settle 30`).

Nodes run on 127.0.0.71-73 with a generated cluster secret and an HTTP token (`http_token_file`):
`/cluster` refuses a request without it (401), and the dashboard is opened as `/#token=…`, so
the browser check proves the page's own token path. A driver process writes pages on
node-1 and reads them back through node-2 and node-3 in a loop while the checks run. Every wait
has a deadline; every process is stopped at the end.

Usage: scripts/observability.py [--prometheus DIR] [--skip-browser] [--screenshot FILE]
                                [--settle SECS]
  --prometheus DIR: where `usr/bin/prometheus` and `usr/bin/promtool` are (default: on PATH)
"""

import argparse
import base64
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE = os.path.join(ROOT, "target", "release", "peercache-node")
HOSTS = ["127.0.0.71", "127.0.0.72", "127.0.0.73"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, data=None, method=None, timeout=10, token=None):
    """GET (or POST `data` as JSON) `url`, with a bearer `token` if given; returns (status,
    body bytes)."""
    body = None if data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_for(what, check, within):
    """Calls `check` until it returns something truthy; fails after `within` seconds."""
    end = time.monotonic() + within
    last = None
    while time.monotonic() < end:
        try:
            got = check()
            if got:
                return got
        except (OSError, ValueError, KeyError) as e:
            last = e
        time.sleep(0.2)
    sys.exit(f"observability: {what}: not within {within} s (last error: {last})")


class Cluster:
    def __init__(self, work):
        self.work = work
        self.meta = free_port()
        self.metrics = free_port()
        self.client = free_port()
        self.env = dict(os.environ, PEERCACHE_CLUSTER_SECRET=secrets.token_hex(32), RUST_LOG="warn")
        self.token = secrets.token_hex(32)
        self.token_file = os.path.join(work, "http-token")
        with open(os.open(self.token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(self.token + "\n")
        self.procs = []

    def start(self):
        seed = f"{HOSTS[0]}:{self.meta}"
        for i, host in enumerate(HOSTS, 1):
            log = open(os.path.join(self.work, f"node-{i}.log"), "w")
            self.procs.append(subprocess.Popen(
                [NODE, "--discovery-addr", seed, "--host", host,
                 "--set", f"node_id=node-{i}", "--set", "protocol=tcp",
                 "--set", "host_local=false", "--set", "global_segment_size=64mb",
                 "--set", f"metrics_port={self.metrics}", "--set", "client_enabled=true",
                 "--set", f"client_port={self.client}", "--set", "heartbeat_interval=0.5",
                 "--set", "member_ttl=2", "--set", f"http_token_file={self.token_file}"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT))
        for host in HOSTS:
            wait_for(f"{host}'s /healthz", lambda h=host: http(self.url(h, "/healthz"))[0] == 200, 30)
        wait_for("three members on every node", lambda: all(
            len(json.loads(http(self.url(h, "/cluster"), token=self.token)[1])["members"]) == 3
            for h in HOSTS), 30)
        # Without the token (or with another) /cluster answers 401 and shows nothing.
        for token in (None, secrets.token_hex(32)):
            status, body = http(self.url(HOSTS[0], "/cluster"), token=token)
            if status != 401 or b"members" in body:
                sys.exit(f"observability: /cluster without the token answered {status}: {body[:200]!r}")

    def url(self, host, path):
        return f"http://{host}:{self.metrics}{path}"

    def drive(self):
        """One round of the driver: writes on node-1, reads back through node-2 and node-3."""
        r = subprocess.run(
            [NODE, "drive", "--discovery-addr", f"{HOSTS[0]}:{self.meta}", "--members", "3",
             "--write-on", "node-1", "--pages", "64", "--page-size", "64kb", "--timeout", "10",
             "--http-token-file", self.token_file],
            env=self.env, capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            sys.exit(f"observability: the driver failed: {r.stderr.strip()}")

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Load(threading.Thread):
    """Runs the driver round after round until stopped."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster, self.stopping, self.rounds = cluster, threading.Event(), 0

    def run(self):
        while not self.stopping.is_set():
            self.cluster.drive()
            self.rounds += 1
            self.stopping.wait(0.5)

    def stop(self):
        self.stopping.set()
        self.join(timeout=90)


def grafana_queries():
    with open(os.path.join(ROOT, "docs", "grafana-dashboard.json")) as f:
        board = json.load(f)
    out = []

    def walk(o):
        if isinstance(o, dict):
            for k, v in o.items():
                if k == "expr":
                    out.append(v)
                else:
                    walk(v)
        elif isinstance(o, list):
            for x in o:
                walk(x)

    walk(board)
    return out


def check_prometheus(cluster, bindir, work):
    prom = os.path.join(bindir, "prometheus") if bindir else shutil.which("prometheus")
    promtool = os.path.join(bindir, "promtool") if bindir else shutil.which("promtool")
    if not (prom and os.path.exists(prom) and promtool and os.path.exists(promtool)):
        sys.exit("observability: prometheus and promtool not found (--prometheus DIR)")
    # Every node's exposition passes promtool's checks.
    for h in HOSTS:
        _, text = http(cluster.url(h, "/metrics"))
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
        if r.returncode != 0:
            sys.exit(f"observability: promtool check metrics on {h}: "
                     f"{(r.stdout + r.stderr).decode().strip()}")
    print(f"promtool check metrics: ok on {len(HOSTS)} nodes")

    port = free_port()
    cfg = os.path.join(work, "prometheus.yml")
    targets = ", ".join(f"'{h}:{cluster.metrics}'" for h in HOSTS)
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: peercache\n"
                f"    static_configs:\n      - targets: [{targets}]\n")
    log = open(os.path.join(work, "prometheus.log"), "w")
    proc = subprocess.Popen(
        [prom, f"--config.file={cfg}", f"--storage.tsdb.path={os.path.join(work, 'tsdb')}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        def targets_up():
            v = json.loads(http(f"{api}/targets")[1])["data"]["activeTargets"]
            return len(v) == len(HOSTS) and all(t["health"] == "up" for t in v)

        wait_for("every target up in Prometheus", targets_up, 60)
        print(f"prometheus: {len(HOSTS)} targets up")

        def query(q):
            _, body = http(f"{api}/query?" + urllib.parse.urlencode({"query": q}))
            v = json.loads(body)
            if v.get("status") != "success":
                sys.exit(f"observability: Prometheus refused {q!r}: {v}")
            return v["data"]["result"]

        load = Load(cluster)
        load.start()
        try:
            got = wait_for("rate(peercache_bytes_read_total[30s]) > 0",
                           lambda: query("rate(peercache_bytes_read_total[30s]) > 0"), 60)
            nodes = sorted(r["metric"].get("node", "?") for r in got)
            print(f"prometheus: rate(peercache_bytes_read_total[30s]) > 0 on {nodes}")
            queries = grafana_queries()
            for q in queries:
                expr = q.replace("$node", ".+")
                wait_for(f"Grafana query {expr!r} returns data", lambda e=expr: query(e), 30)
            print(f"prometheus: all {len(queries)} queries of docs/grafana-dashboard.json return data")
        finally:
            load.stop()
        return load
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def check_browser(cluster, work, screenshot, settle):
    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        sys.exit("observability: chromium and chromedriver are needed (Debian: chromium chromium-driver)")
    port = free_port()
    log = open(os.path.join(work, "chromedriver.log"), "w")
    proc = subprocess.Popen([driver, f"--port={port}"], stdout=log, stderr=subprocess.STDOUT)
    wd = f"http://127.0.0.1:{port}"
    session = None
    load = Load(cluster)
    try:
        wait_for("chromedriver", lambda: http(f"{wd}/status")[0] == 200, 30)
        caps = {"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--user-data-dir={os.path.join(work, 'chromium-profile')}",
                     "--window-size=1000,1000"]}}}}
        status, body = http(f"{wd}/session", caps, timeout=90)
        if status != 200:
            sys.exit(f"observability: chromedriver would not start Chromium: {body[:500]!r}")
        session = json.loads(body)["value"]["sessionId"]
        s = f"{wd}/session/{session}"
        load.start()
        page = cluster.url(HOSTS[1], f"/#token={cluster.token}")
        http(f"{s}/url", {"url": page}, timeout=60)
        # What the page shows, read from its DOM, and how many pixels of the chart's canvas the
        # read line (#2a6fdb) painted.
        probe = """
            const t = id => document.getElementById(id).textContent;
            const c = document.getElementById('chart');
            const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let blue = 0;
            for (let i = 0; i < px.length; i += 4) {
              if (Math.abs(px[i] - 0x2a) < 40 && Math.abs(px[i + 1] - 0x6f) < 40 &&
                  Math.abs(px[i + 2] - 0xdb) < 40 && px[i + 3] > 0) blue++;
            }
            return {members: t('members'), rows: document.querySelectorAll('#peers tbody tr').length,
                    hit: t('hit'), rps: t('rps'), rmb: t('rmb'), status: t('status'), blue,
                    reads: typeof series === 'undefined' ? [] : series.map(p => p[0])};
        """

        def shown():
            _, body = http(f"{s}/execute/sync", {"script": probe, "args": []})
            v = json.loads(body)["value"]
            ok = (v["members"] == "3" and v["rows"] == 3 and any(c.isdigit() for c in v["hit"])
                  and v["status"].startswith("updated") and len(v["reads"]) >= 4
                  and sum(1 for x in v["reads"] if x > 0) >= 2 and v["blue"] > 50)
            return v if ok else None

        v = wait_for("the dashboard shows three members and real numbers", shown, 90)
        if settle:
            time.sleep(settle)  # a longer chart for the docs' screenshot, not a synchronization
            v = shown() or v
        print(f"dashboard: members {v['members']}, hit rate {v['hit']}, read MB/s {v['rmb']}, "
              f"chart {len(v['reads'])} points, max {max(v['reads']):.0f} pages/s, "
              f"{v['blue']} px of read line ({v['status']})")
        _, body = http(f"{s}/screenshot", timeout=60)
        png = base64.b64decode(json.loads(body)["value"])
        if not png.startswith(b"\x89PNG"):
            sys.exit("observability: the screenshot is not a PNG")
        with open(screenshot, "wb") as f:
            f.write(png)
        print(f"dashboard: screenshot in {screenshot} ({len(png)} bytes)")
    finally:
        if load.is_alive():
            load.stop()
        if session:
            http(f"{wd}/session/{session}", method="DELETE", timeout=30)
        proc.terminate()
        proc.wait(timeout=15)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prometheus", help="folder with the prometheus and promtool binaries")
    ap.add_argument("--skip-browser", action="store_true")
    ap.add_argument("--screenshot", help="where the dashboard's screenshot goes")
    ap.add_argument("--settle", type=float, default=0,
                    help="seconds more of load before the screenshot (a longer chart)")
    args = ap.parse_args()
    if not os.path.exists(NODE):
        sys.exit(f"observability: {NODE} missing: cargo build --release -p peercache-store")
    work = tempfile.mkdtemp(prefix="peercache-observability-")
    cluster = Cluster(work)
    try:
        cluster.start()
        print(f"cluster: {len(HOSTS)} nodes on {', '.join(HOSTS)}")
        check_prometheus(cluster, args.prometheus, work)
        if not args.skip_browser:
            check_browser(cluster, work, args.screenshot or os.path.join(work, "dashboard.png"),
                          args.settle)
    except SystemExit:
        for name in sorted(os.listdir(work)):
            if name.endswith(".log"):
                with open(os.path.join(work, name), errors="replace") as f:
                    tail = f.read()[-1500:]
                print(f"--- {name} (tail)\n{tail}", file=sys.stderr)
        raise
    finally:
        cluster.stop()
    print("observability: ok")


if __name__ == "__main__":
    main()
