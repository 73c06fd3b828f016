"""The monitoring stack operators run, for real: Debian's Prometheus (2.42) scrapes two real
PageWarden engines on loopback, one of them reproducing the 2026 incident, and evaluates the
shipped rules (resources/prometheus/pagewarden-rules.yml); Debian's Alertmanager (0.25)
receives both what Prometheus's rules fire and what each engine forwards itself
(`--alert-webhook`). Both are read back through their own HTTP APIs: the faulty engine's
data-crossed alert reaches Alertmanager with the labels the rules promise, the healthy engine
raises nothing, and a killed engine reads as down. The vLLM tier adds a vLLM with the agent."""

from __future__ import annotations

import json
import random
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from engine.client.local_server import LocalServer, write_config
from engine.config import REPO_ROOT, EngineConfig
from engine.guard.reproduce import run_workload
from engine.guard.scenarios import SCENARIOS, config_sections
from engine.server.alert_forward import instance_label
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e  # real engines, a real Prometheus and Alertmanager

PROMETHEUS, ALERTMANAGER = shutil.which("prometheus"), shutil.which("prometheus-alertmanager")
needs_stack = pytest.mark.skipif(PROMETHEUS is None or ALERTMANAGER is None,
                                 reason="apt install prometheus prometheus-alertmanager (.ci/run does)")
RULES = REPO_ROOT / "resources" / "prometheus" / "pagewarden-rules.yml"
SCRAPE_S = 1  # scrape and rule evaluation interval, so that the test is short
INCIDENT = SCENARIOS["incident-placeholder"]
LEAKING = {"defences": {"manifest_check": False, "writer_tag_check": False}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> object:
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
        return server

    def instance(self, name: str) -> str:
        return urllib.parse.urlparse(self.engines[name].ready["metrics"]).netloc

    def start_prometheus(self) -> None:
        port = _free_port()
        self.prometheus = f"http://127.0.0.1:{port}"
        shutil.copy(RULES, self.tmp / RULES.name)
        targets = json.dumps([self.instance(name) for name in self.engines])
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
        answer = _get(self.prometheus + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        return {r["metric"].get("instance", ""): float(r["value"][1]) for r in answer["data"]["result"]}  # type: ignore[index]

    def alertmanager_alerts(self) -> list[dict]:
        return _get(self.alertmanager + "/api/v2/alerts")  # type: ignore[return-value]

    def stop(self) -> None:
        for server in self.engines.values():
            server.stop()
        for daemon in reversed(self.daemons):
            daemon.stop()


@needs_stack
def test_prometheus_and_alertmanager_see_the_faulty_engine_and_only_it(tmp_path):
    stack = Stack(tmp_path)
    try:
        healthy_config = write_config(tmp_path / "healthy.toml", EngineConfig().replace(canaries={"enabled": False}))
        faulty_config = write_config(tmp_path / "faulty.toml", EngineConfig().replace(canaries={"enabled": False}),
                                     **config_sections(INCIDENT))
        healthy = stack.engine("healthy", healthy_config)
        faulty = stack.engine("faulty", faulty_config, "--allow-faults")
        clients = {name: server.client(timeout_s=300) for name, server in stack.engines.items()}
        for name, server in stack.engines.items():
            server.wait_workers(clients[name])
        clients["faulty"].reconfigure(LEAKING, apply=True)
        faulty.wait_workers(clients["faulty"])
        stack.start_prometheus()
        both = {stack.instance("healthy"), stack.instance("faulty")}
        wait_for(lambda: set(stack.query("pagewarden_up == 1")) == both, 60, "Prometheus to scrape both engines")
        # the faulty engine says what it is, and that its defences are off
        info = _get(stack.prometheus + "/api/v1/query?query=pagewarden_engine_info")["data"]["result"]  # type: ignore[index]
        assert {r["metric"]["instance"] for r in info} == both
        assert all(r["metric"]["role"] == "pagewarden" and r["metric"]["control"] for r in info)
        off = stack.query('count by (instance) (pagewarden_defence_on == 0)')
        assert set(off) == {stack.instance("faulty")} and off[stack.instance("faulty")] >= 2
        ready = stack.query('sum by (instance) (pagewarden_workers{role="decode", state="ready"})')
        assert ready == {stack.instance("healthy"): 1.0, stack.instance("faulty"): 1.0}

        # the incident: requests read each other's data on the faulty engine only
        run_workload(clients["faulty"], INCIDENT.workload(random.Random(7), 0.5))
        run_workload(clients["healthy"], INCIDENT.workload(random.Random(8), 0.2))
        crossed = 'sum by (instance) (pagewarden_alert_events_total{crossed="true"})'
        wait_for(lambda: stack.query(crossed).get(stack.instance("faulty"), 0) > 0, 60,
                 "the faulty engine's crossed events in Prometheus")
        assert stack.query(crossed).get(stack.instance("healthy")) == 0  # scraped, and nothing crossed

        def rule_alert() -> dict | None:
            return next((a for a in stack.alertmanager_alerts() if a["labels"].get("alertname") == "PageWardenDataCrossed"
                         and a["labels"].get("instance") == stack.instance("faulty")), None)

        wait_for(lambda: rule_alert() is not None, 90, "PageWardenDataCrossed in Alertmanager")
        alert = rule_alert()
        assert alert is not None
        labels = alert["labels"]
        assert labels["severity"] == "critical" and labels["category"] == "isolation" and labels["job"] == "pagewarden"
        assert labels["kind"] in ("ownership_violation", "transfer_mismatch", "canary_leak")
        assert alert["status"]["state"] == "active"
        assert stack.instance("faulty") in alert["annotations"]["summary"]
        # the engine's own forwarder reached the same Alertmanager with the engine's alert
        forwarded = [a for a in stack.alertmanager_alerts() if a["labels"].get("alertname") == "ownership_violation"]
        assert forwarded and all(a["labels"]["severity"] == "critical" for a in forwarded)
        # nothing about the healthy engine: no rule alert, no forwarded isolation alert
        healthy_alerts = [a for a in stack.alertmanager_alerts()
                          if a["labels"].get("instance") in (stack.instance("healthy"), instance_label(healthy.control))]
        assert not [a for a in healthy_alerts if a["labels"].get("category") == "isolation"
                    or a["labels"].get("alertname") in ("ownership_violation", "canary_leak")], healthy_alerts

        # killed: Prometheus reads it as down
        clients["faulty"].close()
        faulty.kill()
        wait_for(lambda: stack.query('up{job="pagewarden"} == 0').keys() == {stack.instance("faulty")}, 30,
                 "the killed engine to read as down")
        assert stack.query('up{job="pagewarden"} == 1').keys() == {stack.instance("healthy")}
    finally:
        for daemon_log in ("prometheus.log", "alertmanager.log"):
            if (tmp_path / daemon_log).exists():
                print(f"---- {daemon_log} (tail)\n" + (tmp_path / daemon_log).read_text()[-1500:])
        stack.stop()
