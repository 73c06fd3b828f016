"""A real Prometheus and Alertmanager around real engines, for the monitoring tests (Debian's
`prometheus` and `prometheus-alertmanager`; .ci/run installs them): Alertmanager first, then
the engines (forwarding their alerts to it), then Prometheus scraping every target and
evaluating the shipped rules, scrape and evaluation every second."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from engine.client.local_server import LocalServer
from engine.config import REPO_ROOT
from tests.waiting import wait_for

PROMETHEUS, ALERTMANAGER = shutil.which("prometheus"), shutil.which("prometheus-alertmanager")
needs_stack = pytest.mark.skipif(PROMETHEUS is None or ALERTMANAGER is None,
                                 reason="apt install prometheus prometheus-alertmanager (.ci/run does)")
RULES = REPO_ROOT / "resources" / "prometheus" / "pagewarden-rules.yml"
SCRAPE_S = 1  # scrape and rule evaluation interval, so that the test is short


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


class _Daemon:
    """A Prometheus or Alertmanager process with its own data directory, logging to a file."""

    def __init__(self, binary: str, args: list[str], log: Path, ready_url: str):
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([binary, *args], stdout=out, stderr=subprocess.STDOUT)
        wait_for(lambda: self._ready(ready_url), 60, f"{Path(binary).name} to answer ({log})")

    def _ready(self, url: str) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class Stack:
    """Alertmanager, then the engines (forwarding to it), then Prometheus scraping them."""

    def __init__(self, tmp: Path):
        self.tmp, self.daemons, self.engines = tmp, [], {}
        self.targets: dict[str, str] = {}  # name -> its /metrics base URL
        am_port = _free_port()
        self.alertmanager = f"http://127.0.0.1:{am_port}"
        (tmp / "alertmanager.yml").write_text(
            "route:\n  receiver: keep\n  group_by: [alertname, instance]\n  group_wait: 1s\n"
            "  group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: keep\n")
        self.daemons.append(_Daemon(ALERTMANAGER, [  # type: ignore[arg-type]  # needs_stack: found
            f"--config.file={tmp / 'alertmanager.yml'}", f"--storage.path={tmp / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
            tmp / "alertmanager.log", self.alertmanager + "/-/ready"))

    def engine(self, name: str, config: Path, *extra: str) -> LocalServer:
        server = LocalServer(config, *extra, "--metrics-port", "0", "--alert-webhook", self.alertmanager)
        self.engines[name] = server
        self.targets[name] = server.ready["metrics"]
        return server

    def instance(self, name: str) -> str:
        return urllib.parse.urlparse(self.targets[name]).netloc

    def start_prometheus(self) -> None:
        port = _free_port()
        self.prometheus = f"http://127.0.0.1:{port}"
        shutil.copy(RULES, self.tmp / RULES.name)
        targets = json.dumps([self.instance(name) for name in self.targets])
        (self.tmp / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {SCRAPE_S}s\n  evaluation_interval: {SCRAPE_S}s\n"
            f"rule_files: [{RULES.name}]\n"
            f"alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['{self.alertmanager[7:]}']\n"
            f"scrape_configs:\n  - job_name: pagewarden\n    static_configs:\n      - targets: {targets}\n")
        self.daemons.append(_Daemon(PROMETHEUS, [  # type: ignore[arg-type]  # needs_stack: found
            f"--config.file={self.tmp / 'prometheus.yml'}", f"--storage.tsdb.path={self.tmp / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{port}"], self.tmp / "prometheus.log", self.prometheus + "/-/ready"))

    def query(self, promql: str) -> dict[str, float]:
        """instance -> value of an instant query."""
        answer = get_json(self.prometheus + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        return {r["metric"].get("instance", ""): float(r["value"][1]) for r in answer["data"]["result"]}  # type: ignore[index]

    def alertmanager_alerts(self) -> list[dict]:
        return get_json(self.alertmanager + "/api/v2/alerts")  # type: ignore[return-value]

    def stop(self) -> None:
        for server in self.engines.values():
            server.stop()
        for daemon in reversed(self.daemons):
            daemon.stop()


