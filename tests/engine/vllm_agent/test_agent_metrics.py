"""The agent's /metrics on a port of its own: the families a PageWarden engine exports, with the
agent's role, pool and alerts, so one Prometheus and one set of rules watch both kinds of
engine. Without vLLM: the agent fed snapshots and an alert directly."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.http.prometheus_text import metric_names
from engine.vllm_agent.agent_server import AgentServer
from engine.vllm_agent.checks import capacity_finding
from engine.vllm_agent.metrics_port import parse_address
from tests.engine.vllm_agent.test_agent_core import BS, req, snap
from tests.waiting import wait_for


def _scrape(url: str) -> dict[str, list]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_the_agent_exports_the_engine_families_with_its_role_pool_and_alerts():
    agent = AgentServer("tcp://127.0.0.1:0", "tcp://127.0.0.1:0", num_blocks=16, block_size=BS,
                        facts={"vllm_version": "0.32.0", "model": "/models/copy"},
                        capacity=capacity_finding(4096, 16, BS), metrics="127.0.0.1:0")
    try:
        url = agent.metrics_port.url
        agent.offer(snap([req("r1", [5, 6], 64, ["a0", "a1"])], {5: (1, "a0"), 6: (1, "a1")}))
        agent.offer_alert("transfer_mismatch", "request r1: a loaded block failed", subject="request:r1",
                          requests=("r1",), pages=(6,), prevented=True)
        found = wait_for(lambda: (s := _scrape(url)).get("pagewarden_engine_info") and
                         any(v for _, v in s.get("pagewarden_alert_events_total", [])) and s, 15,
                         "the agent's metrics with its alert")
        assert set(found) <= set(metric_names())  # only declared families
        (info,) = found["pagewarden_engine_info"]
        assert info[0]["role"] == "vllm_agent" and info[0]["model"] == "/models/copy"
        assert info[0]["control"] == agent.control_endpoint
        assert ({"pool": "vllm", "role": "vllm"}, 16.0) in found["pagewarden_pool_pages"]
        # capacity 4096 tokens over 16 blocks of BS: the window exceeds the pool
        assert [v for _, v in found["pagewarden_capacity_exceeds_window"]] == [1.0]
        events = {lab["kind"]: v for lab, v in found["pagewarden_alert_events_total"]}
        episodes = {lab["kind"]: v for lab, v in found["pagewarden_alerts_fired_total"]}
        assert events["transfer_mismatch"] == 1 and episodes["transfer_mismatch"] == 1
        assert ({"role": "vllm", "state": "ready"}, 1.0) in found["pagewarden_workers"]
        with pytest.raises(urllib.error.HTTPError) as other:
            urllib.request.urlopen(url + "/v1/models", timeout=10)
        assert other.value.code == 404
        other.value.close()
    finally:
        agent.close()


def test_a_bad_metrics_address_is_refused_with_the_value():
    with pytest.raises(ValueError, match="metrics address 'nowhere'"):
        parse_address("nowhere")
    with pytest.raises(ValueError, match="port in 0..65535"):
        parse_address("127.0.0.1:70000")
    with pytest.raises(ValueError, match="'10.1.2.3:9100' is not a loopback address"):
        parse_address("10.1.2.3:9100")
    assert parse_address("10.1.2.3:9100", allow_remote=True) == ("10.1.2.3", 9100)
