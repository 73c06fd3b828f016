"""Issue 15: the engine in the operator's monitoring stack. `GET /metrics` on --http-port and
alone on --metrics-port, in the Prometheus text format (parsed here by prometheus-client's
own parser), and a Grafana dashboard whose every query names an exported metric."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.client.local_server import LocalServer, write_config
from engine.config import REPO_ROOT
from engine.guard.canaries import PROMPT_FORM
from engine.http.prometheus_text import METRICS, PREFIX, exposition, metric_names
from engine.wire.alert_kinds import ALERT_KINDS

DASHBOARD = REPO_ROOT / "resources" / "grafana" / "pagewarden-dashboard.json"


def samples(text: str) -> dict[str, list]:
    """sample name -> [(labels, value)], through prometheus-client's parser."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(found: dict, name: str, **labels) -> float:
    (match,) = [v for lab, v in found[name] if all(lab.get(k) == w for k, w in labels.items())]
    return match


def test_a_status_reply_becomes_every_declared_metric():
    status = {
        "load": {"queue_depth": 3, "running": 2,
                 "pools": {"prefill-0": {"role": "prefill", "pages": 80, "used_pages": 20}}},
        "metrics": {"tokens_per_s": 250.0, "tokens_total": 4000,
                    "ttft_seconds": {"buckets": [[0.1, 1], [1.0, 3], ["+Inf", 4]], "sum": 6.5, "count": 4},
                    "tpot_seconds": {"buckets": [[0.01, 2], ["+Inf", 2]], "sum": 0.01, "count": 2}},
        "engine": {"uptime_s": 12.5, "version": "0.9", "model": "/m/copy", "role": "pagewarden",
                   "control": "tcp://127.0.0.1:5650"},
        "workers": [{"name": "decode-0", "role": "decode", "state": "ready", "restarts": 0},
                    {"name": "decode-1", "role": "decode", "state": "crashed", "restarts": 3},
                    {"name": "prefill-0", "role": "prefill", "state": "ready", "restarts": 0}],
        "config": {"defences": {"manifest_check": False}, "faults": {"skip_scrub": True}},
        "alerts": [{"kind": "ownership_violation", "severity": "critical", "state": "firing"}],
        "counters": {"alert:ownership_violation": 1_710},  # events: three waves of many reads each
        "alert_episodes": {"ownership_violation": 3},
        "cross_reads": {"total": 1234},
        "capacity": [{"limit": "pool:prefill", "exceeds": True}],
        "telemetry": {"refused_subscriptions": 5},
    }
    found = samples(exposition(status).decode())
    assert set(found) == set(metric_names())  # every declared metric, nothing undeclared
    assert value(found, "pagewarden_pool_usage_ratio", pool="prefill-0") == 0.25
    assert value(found, "pagewarden_queue_depth") == 3
    assert value(found, "pagewarden_generated_tokens_total") == 4000
    assert value(found, "pagewarden_time_to_first_token_seconds_bucket", le="1.0") == 3
    assert value(found, "pagewarden_time_to_first_token_seconds_count") == 4
    assert value(found, "pagewarden_workers", role="decode", state="crashed") == 1
    assert value(found, "pagewarden_alerts", kind="ownership_violation", state="firing") == 1
    assert value(found, "pagewarden_alerts_fired_total", kind="ownership_violation") == 3  # episodes
    assert value(found, "pagewarden_alert_events_total", kind="ownership_violation") == 1_710
    # every state of an enum gauge, 0 where none: a rule on state="ready" reads 0 rather than nothing
    assert value(found, "pagewarden_workers", role="prefill", state="crashed") == 0
    assert value(found, "pagewarden_workers", role="prefill", state="starting") == 0
    assert value(found, "pagewarden_alerts", kind="canary_leak", state="firing") == 0
    assert value(found, "pagewarden_worker_restarts_total", worker="decode-1", role="decode") == 3
    assert value(found, "pagewarden_defence_on", defence="manifest_check") == 0
    assert value(found, "pagewarden_defence_on", defence="writer_tag_check") == 1  # unset: on
    assert value(found, "pagewarden_fault_on", fault="skip_scrub") == 1
    assert value(found, "pagewarden_fault_on", fault="placeholder_on_reject") == 0
    assert value(found, "pagewarden_engine_info", role="pagewarden", model="/m/copy",
                 control="tcp://127.0.0.1:5650", version="0.9") == 1
    assert value(found, "pagewarden_cross_reads_total") == 1234
    assert value(found, "pagewarden_capacity_exceeds_window", limit="pool:prefill") == 1


@pytest.mark.e2e
def test_metrics_on_the_http_port_and_alone_on_the_metrics_port(tmp_path):
    config = write_config(tmp_path / "config.toml", engine={"context_window": 512},
                          pools={"prefill": {"pages": 64}, "decode": {"pages": 128}})
    server = LocalServer(config, "--http-port", "0", "--metrics-port", "0")
    try:
        server.wait_workers(server.client())
        body = {"prompt": PROMPT_FORM.format(text="metrics please"), "max_tokens": 8, "temperature": 0}
        request = urllib.request.Request(server.ready["http"] + "/v1/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=180) as response:
            assert response.status == 200
        for base in (server.ready["http"], server.ready["metrics"]):
            with urllib.request.urlopen(base + "/metrics", timeout=60) as response:
                assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                found = samples(response.read().decode())
            assert value(found, "pagewarden_up") == 1
            assert value(found, "pagewarden_pool_pages", pool="prefill-0") == 64
            assert value(found, "pagewarden_pool_pages", pool="decode-0") == 128
            assert value(found, "pagewarden_time_to_first_token_seconds_count") >= 1
            assert value(found, "pagewarden_generated_tokens_total") >= 8
            assert value(found, "pagewarden_workers", role="decode", state="ready") == 1
        # the metrics port serves metrics only
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(server.ready["metrics"] + "/v1/models", timeout=60)
        assert missing.value.code == 404
        missing.value.close()  # the error holds the response's socket
    finally:
        server.stop()


def test_a_bad_metrics_port_is_refused_with_the_limit(tmp_path):
    config = write_config(tmp_path / "config.toml")
    proc = subprocess.run([sys.executable, "main.py", "serve", "--config", str(config), "--metrics-port", "70000"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--metrics-port 70000 is outside 0..65535" in proc.stdout + proc.stderr


def test_the_grafana_dashboard_queries_only_exported_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    exported = set(metric_names())
    queried = set()
    for panel in _query_panels(dashboard):
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(re.findall(r"\b" + PREFIX + r"[a-z_]+", target["expr"]))
            assert names or re.match(r"count\(up\{", target["expr"]), (panel["title"], target["expr"])
            assert names <= exported, (panel["title"], names - exported)
            queried |= names
    # every metric family is on the dashboard somewhere
    families = {PREFIX + name for name in METRICS}
    assert {f for f in families if not any(q.startswith(f) for q in queried)} == set()


def test_the_dashboard_selects_where_data_crossed_by_label_and_is_scoped_to_the_chosen_engines():
    """The "data crossed" panel selects crossed="true", which /metrics derives from each kind's
    declaration (a kind declared later needs no dashboard edit), and every query of an engine's
    metric is scoped to the $instance and $job variables (one engine of a fleet, or all)."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource", "job", "instance"]
    for panel in _query_panels(dashboard):
        for target in panel["targets"]:
            for names in re.findall(r'\bkind=~?"([^"]*)"', target["expr"]):
                unknown = set(names.split("|")) - {k.name for k in ALERT_KINDS}
                assert not unknown, (panel["title"], f"undeclared alert kinds {sorted(unknown)}")
            for selector in re.findall(PREFIX + r'[a-z_]+(\{[^}]*\})?', target["expr"]):
                assert 'instance=~"$instance"' in selector and 'job=~"$job"' in selector, (panel["title"], selector)
    (panel,) = [p for p in dashboard["panels"] if p["title"].startswith("Data crossed")]
    (expr,) = [t["expr"] for t in panel["targets"]]
    assert 'pagewarden_alerts_fired_total{crossed="true"' in expr
    status = {"alert_episodes": {k.name: 1 for k in ALERT_KINDS}}
    found = samples(exposition(status).decode())
    marked = {labels["kind"] for labels, _ in found["pagewarden_alerts_fired_total"] if labels["crossed"] == "true"}
    assert marked == {k.name for k in ALERT_KINDS if k.isolation and k.detects_cross_reads
                      and not k.prevented_by_firing} and "canary_leak" in marked and "ownership_violation" in marked


def _query_panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]
