"""PageWarden's agent inside a real vLLM 0.32 (CPU build): vLLM's block pool by owner request,
and each isolation check on vLLM's own state, fired by breaking that state on purpose."""

from __future__ import annotations

import concurrent.futures as cf
import random
import threading

import numpy as np
import pytest

from engine.adapters.prometheus_fleet import FleetQuery
from engine.client.engine_client import EngineClient, RemoteError
from engine.client.local_server import write_config
from engine.client.subscriber import TelemetrySubscriber
from engine.config import EngineConfig
from engine.guard.reproduce import run_workload
from engine.guard.scenarios import SCENARIOS, config_sections
from engine.wire.page_tags import PageState
from gui.model.fleet import fleet_rows
from tests.prometheus_stack import Stack, needs_stack
from tests.vllm.vllm_server import VllmServer, free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.vllm
INCIDENT = SCENARIOS["incident-placeholder"]
LEAKING = {"defences": {"manifest_check": False, "writer_tag_check": False}}

PREFIXES = ("the quick brown fox jumps over the lazy dog " * 3, "lorem ipsum dolor sit amet consectetur " * 3,
            "river stone light cloud north south green amber " * 2)


class PageWatch:
    """Folds the agent's `pages/vllm` and `requests` telemetry, keeping what a test asks about."""

    def __init__(self, endpoint: str):
        self.sub = TelemetrySubscriber(endpoint)
        self.arrays: dict[str, np.ndarray] | None = None
        self.seq = None
        self.gaps = 0
        self.max_refs = 0
        self.shared_seen: set[int] = set()
        self.requests: dict[str, dict] = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self.sub.recv(0.1)
            if msg is None:
                continue
            if msg.topic == "pages/vllm":
                if msg.get("kind") == "keyframe":
                    self.arrays = {k: v.copy() for k, v in msg.arrays.items()}
                elif self.arrays is not None and msg.get("seq") == self.seq + 1:
                    for k, v in msg.arrays.items():
                        if k != "index":
                            self.arrays[k][msg.arrays["index"]] = v
                else:
                    self.gaps += 1
                    continue
                self.seq = msg.get("seq")
                refs = self.arrays["refs"]
                self.max_refs = max(self.max_refs, int(refs.max()))
                self.shared_seen.update(np.flatnonzero(refs > 1).tolist())
            elif msg.topic == "requests":
                self.requests[msg.get("request_id")] = dict(msg.header)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.sub.close()


@pytest.fixture(scope="module")
def vllm_with_agent():
    with VllmServer(agent={"metrics": f"127.0.0.1:{free_port()}"}, num_blocks=128, max_model_len=512) as server:
        yield server


@needs_stack
def test_a_real_prometheus_watches_vllm_beside_a_healthy_and_a_faulty_pagewarden_engine(vllm_with_agent, tmp_path):
    """The fleet of the monitoring test with its third engine: the agent's /metrics (a port of
    its own: vLLM's /metrics lives in its API server process) beside two real PageWarden engines,
    one reproducing the incident; one real Prometheus evaluating the shipped rules, one real
    Alertmanager. The faulty engine tops the Fleet view's order and its alert reaches
    Alertmanager; vLLM and the healthy engine raise nothing."""
    base = EngineConfig().replace(canaries={"enabled": False})
    stack = Stack(tmp_path)
    try:
        stack.engine("healthy", write_config(tmp_path / "healthy.toml", base))
        faulty = stack.engine("faulty", write_config(tmp_path / "faulty.toml", base, **config_sections(INCIDENT)),
                              "--allow-faults")
        client = faulty.client(timeout_s=300)
        faulty.wait_workers(client)
        client.reconfigure(LEAKING, apply=True)
        faulty.wait_workers(client)
        stack.targets["vllm"] = "http://" + vllm_with_agent.agent_metrics
        stack.start_prometheus()
        three = {stack.instance(name) for name in ("healthy", "faulty", "vllm")}
        wait_for(lambda: set(stack.query("pagewarden_up == 1")) == three, 120, "Prometheus to scrape all three")
        assert stack.query('pagewarden_engine_info{role="vllm_agent"}').keys() == {stack.instance("vllm")}
        assert stack.query('pagewarden_workers{role="vllm", state="ready"}') == {stack.instance("vllm"): 1.0}
        assert stack.query('pagewarden_pool_pages{pool="vllm"}') == {stack.instance("vllm"): 128.0}
        run_workload(client, INCIDENT.workload(random.Random(7), 0.5))
        rows = wait_for(lambda: (r := fleet_rows(FleetQuery(stack.prometheus, "pagewarden").snapshot()))
                        and len(r) == 3 and r[0].engine.instance == stack.instance("faulty") and r, 90,
                        "the faulty engine at the top of the Fleet view")
        by_instance = {row.engine.instance: row for row in rows}
        assert by_instance[stack.instance("vllm")].engine.kind == "vLLM agent"
        assert by_instance[stack.instance("vllm")].finding == "healthy"
        assert by_instance[stack.instance("healthy")].finding == "healthy"
        wait_for(lambda: any(a["labels"].get("alertname") == "PageWardenDataCrossed"
                             and a["labels"].get("instance") == stack.instance("faulty")
                             for a in stack.alertmanager_alerts()), 90, "PageWardenDataCrossed in Alertmanager")
        others = [a for a in stack.alertmanager_alerts() if a["labels"].get("category") == "isolation"
                  and a["labels"].get("instance") != stack.instance("faulty")]
        assert not others, others
        client.close()
    finally:
        stack.stop()


def test_agent_answers_as_a_read_only_pagewarden_engine(vllm_with_agent):
    with EngineClient(vllm_with_agent.agent_control) as client:
        status = client.status()
        engine = status["engine"]
        assert engine["read_only"] is True and engine["name"] == "vLLM 0.32.0 (PageWarden agent)"
        assert engine["block_size"] == 32 and engine["prefix_caching"] is True
        assert status["workers"][0]["pool"] == {"name": "vllm", "pages": 128, "page_size": 32,
                                                "used_pages": status["workers"][0]["pool"]["used_pages"]}
        # vLLM's own startup check and ours agree on the capacity: 127 usable blocks x 32 tokens
        [finding] = status["capacity"]
        assert (finding["limit_tokens"], finding["exceeds"]) == (127 * 32, False)
        with pytest.raises(RemoteError) as refused:
            client.call("submit", prompt="hello", max_tokens=4)
        assert refused.value.code == "read_only" and "'submit' refused" in str(refused.value)
        with pytest.raises(RemoteError):
            client.reconfigure({"context_window": 1024}, apply=True)


def test_1000_clean_requests_with_prefix_caching_raise_no_alert_and_show_shared_blocks(vllm_with_agent):
    server = vllm_with_agent
    with EngineClient(server.agent_control) as client:
        watch = PageWatch(client.status()["engine"]["telemetry"])
        try:
            client.keyframe()
            wait_for(lambda: watch.arrays is not None, timeout_s=30, what="a keyframe")
            rnd = random.Random(7)
            prompts = [(rnd.choice(PREFIXES) + f" request {i} " + "x" * rnd.randint(0, 90), rnd.randint(1, 24))
                       for i in range(1000)]
            with cf.ThreadPoolExecutor(16) as pool:
                replies = list(pool.map(lambda p: server.complete(*p), prompts))
            assert len(replies) == 1000 and all(r["choices"][0]["text"] for r in replies)
            status = wait_for(lambda: (s := client.status()) and s["workers"][0]["pool"]["used_pages"] == 0 and s,
                              timeout_s=30, what="every block released")
            findings = {k: v for k, v in status["counters"].items() if k.startswith("findings:")}
            assert findings == {} and status["alerts"] == []
            assert status["counters"]["snapshots"] > 100
            assert status["cost"]["scheduler_s"] > 0 and status["cost"]["thread_cpu_s"] > 0  # it counts its cost
            # prefix caching shared full blocks between live requests, and the map showed it
            assert watch.max_refs >= 2 and len(watch.shared_seen) >= 1
            wait_for(lambda: watch.arrays is not None and not (watch.arrays["state"] != PageState.FREE).any(),
                     timeout_s=30, what="the map to show every block free")
            finished = [r for r in watch.requests.values() if r.get("phase") == "finished"]
            assert len(finished) >= 900  # telemetry may drop a few under load; the gaps say so
            assert {r["finish_reason"] for r in finished} <= {"length", "stop"}
        finally:
            watch.close()


FAULTS = {
    # fault: (alert kind, words in the detail)
    "swap_block": ("ownership_violation", "another request's data"),
    "ref_drop": ("ownership_violation", "the pool counts ref_cnt"),
    "extra_block": ("block_table_mismatch", "which need"),
    "share_partial": ("ownership_violation", "block"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_check_fires_on_vllm_state_broken_on_purpose(fault):
    kind, words = FAULTS[fault]
    with VllmServer(agent={"test_fault": fault}, env={"PAGEWARDEN_ALLOW_FAULTS": "1"}) as server:
        with EngineClient(server.agent_control) as client:
            assert client.status()["alerts"] == []
            prompt = "the quick brown fox jumps over the lazy dog " * 4
            with cf.ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda i: server.complete(f"request {i} " + prompt, 40), range(8)))
            status = wait_for(lambda: (s := client.status()) and any(a["kind"] == kind for a in s["alerts"]) and s,
                              timeout_s=30, what=f"a {kind} alert")
        alert = next(a for a in status["alerts"] if a["kind"] == kind)
        assert words in alert["detail"] and alert["requests"] and alert["pages"]
        assert alert["severity"] == "critical" and alert["pool"] == "vllm"


def test_vllm_refuses_a_window_its_pool_cannot_hold_and_agrees_with_the_agent_on_the_boundary():
    """vLLM 0.32 checks max_model_len against its KV cache at start; the agent's capacity
    finding must draw the line at the same place (31 usable blocks x 32 = 992 tokens)."""
    with pytest.raises(RuntimeError) as refused:
        VllmServer(agent={}, num_blocks=32, max_model_len=4096).__enter__()
    assert "estimated maximum model length is 992" in str(refused.value)
    with VllmServer(agent={}, num_blocks=32, max_model_len=992) as server:
        with EngineClient(server.agent_control) as client:
            [finding] = client.status()["capacity"]
    assert (finding["window_tokens"], finding["limit_tokens"], finding["exceeds"]) == (992, 992, False)
