"""A fleet of 500 engines, as Prometheus sees it: 500 PageWarden-shaped /metrics targets served
by this one light process (generated families, no model), scraped by Debian's real
Prometheus, then the Fleet view's own client (engine/adapters/prometheus_fleet.py) timed against it.

    .venv/bin/python bench/fleet_scale.py [--engines 500] [--scrape-s 5] [--refreshes 10]

Each target answers `engine/http/prometheus_text.exposition` of a generated `status`: two pools,
two workers, every alert kind; a few engines cross data (their crossed events grow), one in
fifty is faulty, one in a hundred has its window over a pool. Printed: scrape health (targets
up, scrape duration p50/p99 from Prometheus's own `scrape_duration_seconds`), then per refresh
of the Fleet view: wall time of its queries and rows. No assertion: a bench
measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.adapters.prometheus_fleet import FleetQuery  # noqa: E402
from engine.http.prometheus_text import CONTENT_TYPE, exposition  # noqa: E402



class Engine:
    """One generated engine: its status changes a little on every scrape."""

    def __init__(self, n: int, rng: random.Random):
        self.n, self.rng = n, rng
        self.faulty = n % 50 == 7
        self.over = n % 100 == 3
        self.events = 0
        self.started = time.time() - rng.uniform(60, 86_400)

    def status(self) -> dict:
        if self.faulty:
            self.events += self.rng.randint(0, 40)
        used = self.rng.randint(0, 4096)
        return {
            "engine": {"uptime_s": time.time() - self.started, "version": "0.9", "model": "/models/llama-8b",
                       "role": "pagewarden", "control": f"tcp://10.0.{self.n // 250}.{self.n % 250}:5650"},
            "load": {"queue_depth": self.rng.randint(0, 20), "running": self.rng.randint(0, 64),
                     "pools": {f"prefill-{self.n}": {"role": "prefill", "pages": 4096, "used_pages": used},
                               f"decode-{self.n}": {"role": "decode", "pages": 8192, "used_pages": used * 2}}},
            "metrics": {"tokens_per_s": self.rng.uniform(500, 4000), "tokens_total": self.rng.randint(0, 10**9),
                        "ttft_seconds": {"buckets": [[0.1, 5], [1.0, 9], ["+Inf", 10]], "sum": 3.0, "count": 10},
                        "tpot_seconds": {"buckets": [[0.01, 7], ["+Inf", 10]], "sum": 0.2, "count": 10}},
            "workers": [{"name": "prefill-0", "role": "prefill", "state": "ready", "restarts": 0},
                        {"name": "decode-0", "role": "decode", "state": "ready", "restarts": int(self.faulty)}],
            "config": {"defences": {"manifest_check": not self.faulty}, "faults": {"skip_scrub": self.faulty}},
            "alerts": [{"kind": "ownership_violation", "severity": "critical", "state": "firing"}] if self.faulty else [],
            "counters": {"alert:ownership_violation": self.events},
            "alert_episodes": {"ownership_violation": 1 if self.events else 0},
            "cross_reads": {"total": self.events * 3},
            "capacity": [{"limit": "pool:prefill", "exceeds": self.over}],
            "telemetry": {"refused_subscriptions": 0},
        }


def _free_ports(count: int) -> list[int]:
    socks, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def serve_targets(engines: list[Engine], ports: list[int], ready: threading.Event) -> None:
    """Every engine's /metrics on its own port, one event loop, this process."""
    from aiohttp import web

    async def main() -> None:
        runners = []
        for engine, port in zip(engines, ports):
            async def handle(request: web.Request, engine: Engine = engine) -> web.Response:
                return web.Response(body=exposition(engine.status()), headers={"Content-Type": CONTENT_TYPE})

            app = web.Application()
            app.router.add_get("/metrics", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def query(base: str, promql: str) -> tuple[float, int]:
    """(seconds, series) of one instant query."""
    start = time.perf_counter()
    with urllib.request.urlopen(base + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}),
                                timeout=60) as response:
        answer = json.loads(response.read())
    return time.perf_counter() - start, len(answer["data"]["result"])


def fleet_refresh(base: str) -> tuple[float, int]:
    """One refresh of the Fleet view through its own client: (seconds, rows)."""
    start = time.perf_counter()
    snapshot = FleetQuery(base, job_regex="fleet", timeout_s=60).snapshot()
    if snapshot.error:
        raise RuntimeError(f"the Fleet query failed: {snapshot.error}")
    return time.perf_counter() - start, len(snapshot.rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", type=int, default=500)
    p.add_argument("--scrape-s", type=int, default=5)
    p.add_argument("--refreshes", type=int, default=10)
    p.add_argument("--gui", action="store_true", help="also time the Fleet view (offscreen) taking each refresh")
    args = p.parse_args()
    binary = shutil.which("prometheus")
    if binary is None:
        sys.exit("prometheus is not installed (apt install prometheus)")
    rng = random.Random(0)
    engines = [Engine(n, rng) for n in range(args.engines)]
    ports = _free_ports(args.engines + 1)
    prom_port, ports = ports[0], ports[1:]
    ready = threading.Event()
    threading.Thread(target=serve_targets, args=(engines, ports, ready), daemon=True).start()
    if not ready.wait(120):
        sys.exit("the targets did not start")
    with tempfile.TemporaryDirectory(prefix="fleet-scale-") as tmp:
        config = Path(tmp) / "prometheus.yml"
        targets = json.dumps([f"127.0.0.1:{port}" for port in ports])
        config.write_text(f"global:\n  scrape_interval: {args.scrape_s}s\n  scrape_timeout: {args.scrape_s}s\n"
                          f"scrape_configs:\n  - job_name: fleet\n    static_configs:\n      - targets: {targets}\n")
        base = f"http://127.0.0.1:{prom_port}"
        with open(Path(tmp) / "prometheus.log", "wb") as log:
            prom = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
                                     f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 300
            up = 0
            while time.monotonic() < deadline:
                try:
                    _, up = query(base, 'up{job="fleet"} == 1')
                except OSError:
                    up = 0
                if up >= args.engines:
                    break
                time.sleep(1)
            time.sleep(2 * args.scrape_s)  # a second scrape of every target: increase() has two samples
            durations = sorted(float(v) for v in _values(base, 'scrape_duration_seconds{job="fleet"}'))
            print(f"{args.engines} targets, scrape every {args.scrape_s} s: {up} up; scrape duration p50 "
                  f"{_pct(durations, 50) * 1000:.1f} ms, p99 {_pct(durations, 99) * 1000:.1f} ms")
            took = []
            for i in range(args.refreshes):
                seconds, rows = fleet_refresh(base)
                took.append(seconds)
                print(f"  refresh {i + 1}: {seconds * 1000:.0f} ms, {rows} rows")
                time.sleep(1)
            print(f"Fleet refresh (engine/adapters/prometheus_fleet.py): median {statistics.median(took) * 1000:.0f} ms, "
                  f"max {max(took) * 1000:.0f} ms over {len(took)} refreshes")
            if args.gui:
                gui_frames(base, args.refreshes)
        finally:
            prom.terminate()
            prom.wait(30)


def gui_frames(base: str, refreshes: int) -> None:
    """The Fleet view, offscreen, taking each refresh on the GUI thread: the time to apply a
    snapshot to its table (GUI thread work per refresh) and to paint one frame of it (grab)."""
    import os

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtWidgets import QApplication

    from gui.fleet_view import FleetView

    app = QApplication.instance() or QApplication([])
    view = FleetView(base, job_regex="fleet", refresh_s=3600.0, timeout_s=60.0)
    view.resize(1600, 900)
    view.show()
    applied, painted = [], []
    for _ in range(refreshes):
        snapshot = FleetQuery(base, job_regex="fleet", timeout_s=60).snapshot()  # off the GUI thread in the app
        start = time.perf_counter()
        view._on_snapshot(snapshot)
        app.processEvents()
        applied.append(time.perf_counter() - start)
        start = time.perf_counter()
        view.grab()
        painted.append(time.perf_counter() - start)
        time.sleep(0.5)
    rows = view.table_model.rowCount()
    print(f"Fleet view, {rows} rows: applying a refresh median {statistics.median(applied) * 1000:.1f} ms "
          f"(max {max(applied) * 1000:.1f}); one frame painted median {statistics.median(painted) * 1000:.1f} ms "
          f"(max {max(painted) * 1000:.1f})")
    view.stop()
    view.close()


def _values(base: str, promql: str) -> list[str]:
    with urllib.request.urlopen(base + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}),
                                timeout=60) as response:
        return [r["value"][1] for r in json.loads(response.read())["data"]["result"]]


def _pct(values: list[float], pct: int) -> float:
    return values[min(len(values) - 1, len(values) * pct // 100)] if values else float("nan")


if __name__ == "__main__":
    main()
