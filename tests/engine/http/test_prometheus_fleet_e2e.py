"""The monitoring stack operators run, for real: Debian's Prometheus (2.42) scrapes two real
PageWarden engines on loopback, one of them reproducing the 2026 incident, and evaluates the
shipped rules (resources/prometheus/pagewarden-rules.yml); Debian's Alertmanager (0.25)
receives both what Prometheus's rules fire and what each engine forwards itself
(`--alert-webhook`). Both are read back through their own HTTP APIs: the faulty engine's
data-crossed alert reaches Alertmanager with the labels the rules promise, the healthy engine
raises nothing, and a killed engine reads as down. The vLLM tier adds a vLLM with the agent."""

from __future__ import annotations

import random

import pytest

from engine.adapters.prometheus_fleet import FleetQuery
from engine.client.local_server import write_config
from engine.config import EngineConfig
from engine.guard.reproduce import run_workload
from engine.guard.scenarios import SCENARIOS, config_sections
from engine.server.alert_forward import instance_label
from gui.model.fleet import fleet_rows
from tests.prometheus_stack import Stack, get_json, needs_stack
from tests.waiting import wait_for

pytestmark = pytest.mark.e2e  # real engines, a real Prometheus and Alertmanager

INCIDENT = SCENARIOS["incident-placeholder"]
LEAKING = {"defences": {"manifest_check": False, "writer_tag_check": False}}


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
        info = get_json(stack.prometheus + "/api/v1/query?query=pagewarden_engine_info")["data"]["result"]  # type: ignore[index]
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
        # the Fleet view's own queries and order: the faulty engine first, its control endpoint
        # the one to attach to; the healthy one says so
        rows = wait_for(lambda: (r := fleet_rows(FleetQuery(stack.prometheus, "pagewarden").snapshot()))
                        and r[0].engine.instance == stack.instance("faulty") and len(r) == 2 and r, 60,
                        "the faulty engine at the top of the Fleet view")
        assert rows[0].engine.control == faulty.control and "data crossed" in rows[0].finding
        assert rows[1].engine.instance == stack.instance("healthy") and rows[1].finding == "healthy"

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
