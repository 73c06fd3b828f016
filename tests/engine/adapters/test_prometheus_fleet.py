"""FleetQuery against a small fake Prometheus (http.server in a thread) serving canned answers:
the rows it joins, the PromQL it sends (only names of METRICS or `up`), and every failure as a
value in the snapshot: Prometheus down, slow past the timeout, a bad or oversized answer."""

from __future__ import annotations

import json
import re
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.adapters.prometheus_fleet import HISTORY_POINTS, FleetQuery, parse_duration, scrape_interval_of
from engine.http.prometheus_text import metric_names

CONFIG_YAML = "global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\nscrape_configs:\n  - job_name: pagewarden\n"


def vector(*samples: tuple[dict, float]) -> dict:
    return {"resultType": "vector", "result": [{"metric": m, "value": [1.0, str(v)]} for m, v in samples]}


def info(instance: str, role: str = "pagewarden", control: str = "tcp://10.0.0.1:5650") -> dict:
    return {"__name__": "pagewarden_engine_info", "instance": instance, "job": "pagewarden", "role": role,
            "model": "pagewarden-copy", "control": control, "version": "1"}


def fleet_answers(query: str) -> dict:
    """Three engines: a healthy one, a faulty one (data crossed) and one that went down."""
    a, b, c = ({"instance": i, "job": "pagewarden"} for i in ("a:9100", "b:9100", "c:9100"))
    if query.startswith("up"):
        return vector((a, 1), (b, 1), (c, 0))
    if "engine_info" in query:
        return vector((info("a:9100"), 1), (info("b:9100", control="tcp://10.0.0.2:5650"), 1),
                      (info("c:9100", role="vllm_agent", control="tcp://10.0.0.3:5650"), 1))
    if query.startswith("pagewarden_pool_usage_ratio"):
        return vector(({**a, "pool": "decode"}, 0.25), ({**a, "pool": "prefill"}, 0.5), ({**b, "pool": "decode"}, 0.9))
    if "alert_events_total" in query:
        return vector((a, 0), (b, 3))
    if "cross_reads_total" in query:
        return vector((a, 0), (b, 12))
    if "pagewarden_alerts{" in query:
        return vector((a, 0), (b, 1))
    if "defence_on" in query:
        return vector((b, 2))
    if "uptime" in query:
        return vector((a, 3600), (b, 120))
    return vector()


class FakePrometheus:
    """Serves /api/v1/query, /api/v1/query_range and /api/v1/status/config from `answer(query)`."""

    def __init__(self, answer=fleet_answers, *, hold: threading.Event | None = None, raw: bytes | None = None):
        self.queries: list[str] = []
        self.answer, self.hold, self.raw = answer, hold, raw
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def do_GET(self):
                url = urllib.parse.urlparse(self.path)
                params = urllib.parse.parse_qs(url.query)
                if fake.hold is not None:
                    fake.hold.wait(30)
                if fake.raw is not None:
                    body = fake.raw
                elif url.path == "/api/v1/status/config":
                    body = json.dumps({"status": "success", "data": {"yaml": CONFIG_YAML}}).encode()
                elif url.path == "/api/v1/query_range":
                    fake.queries.append(params["query"][0])
                    start, step = float(params["start"][0]), float(params["step"][0])
                    values = [[start + step * k, v] for k, v in ((38, "0.5"), (39, "0.7"), (40, "0.9"), (90, "1"))]
                    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
                        {"metric": {"instance": "b:9100"}, "values": values}]}}).encode()
                else:
                    fake.queries.append(params["query"][0])
                    body = json.dumps({"status": "success", "data": fake.answer(params["query"][0])}).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (the timeout test)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    servers = []

    def start(*args, **kwargs) -> FakePrometheus:
        servers.append(FakePrometheus(*args, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_rows_join_every_query_by_instance(fake):
    prom = fake()
    snap = FleetQuery(prom.url, timeout_s=30).snapshot()
    assert snap.ok, snap.error
    rows = {r.instance: r for r in snap.rows}
    assert set(rows) == {"a:9100", "b:9100", "c:9100"} and snap.left_out == 0
    a, b, c = rows["a:9100"], rows["b:9100"], rows["c:9100"]
    assert a.up and a.kind == "PageWarden engine" and a.pools == {"decode": 0.25, "prefill": 0.5}
    assert a.uptime_s == 3600 and a.crossed_events_5m == 0 and a.control == "tcp://10.0.0.1:5650"
    assert b.crossed_events_5m == 3 and b.cross_reads_5m == 12 and b.critical_firing == 1 and b.defences_off == 2
    assert len(b.usage_history) == HISTORY_POINTS and b.usage_history[-3:] == (0.5, 0.7, 0.9)
    assert set(b.usage_history[:-3]) == {None}  # not scraped then; a point past the window is dropped
    assert c.up is False and c.kind == "vLLM agent" and c.control == "tcp://10.0.0.3:5650"  # its last labels
    assert snap.scrape_interval_s == 5.0 and snap.took_s >= 0


def test_the_promql_names_only_declared_metrics_or_up(fake):
    prom = fake()
    query = FleetQuery(prom.url, job_regex='page"warden.*', timeout_s=30)
    assert query.snapshot().ok
    known = set(metric_names()) | {"up"}
    assert len(prom.queries) >= 12
    for promql in prom.queries:
        names = set(re.findall(r"\b(pagewarden_\w+|up)\b(?=\s*[{\[(])", promql))
        assert names and names <= known, promql
        assert 'job=~"page\\"warden.*"' in promql  # the job regex, quoted
    assert any("query_range" not in q and "pool_usage_ratio" in q for q in prom.queries)


def test_prometheus_down_is_an_error_value():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    snap = FleetQuery(f"http://127.0.0.1:{port}", timeout_s=5).snapshot()
    assert not snap.ok and "cannot reach Prometheus" in snap.error and snap.rows == ()


def test_a_slow_prometheus_is_an_error_value_after_the_timeout(fake):
    prom = fake(hold=threading.Event())
    snap = FleetQuery(prom.url, timeout_s=0.5).snapshot()
    assert not snap.ok and "did not answer within 0.5 s" in snap.error


@pytest.mark.parametrize("raw, words", [
    (b"<html>not json</html>", "not JSON"),
    (json.dumps({"status": "error", "error": "parse error at char 3"}).encode(), "parse error at char 3"),
    (json.dumps({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}).encode(),
     "expected a vector"),
    (json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"instance": "a"}, "value": [1, "many"]}]}}).encode(), "not a number"),
])
def test_a_bad_answer_is_an_error_value(fake, raw, words):
    prom = fake(raw=raw)
    snap = FleetQuery(prom.url, timeout_s=30).snapshot()
    assert not snap.ok and words in snap.error, snap.error


def test_answers_and_rows_are_bounded(fake):
    big = fake(lambda q: vector(*[({"instance": f"x{i}", "job": "j", "padding": "p" * 200}, 1) for i in range(50)]))
    snap = FleetQuery(big.url, timeout_s=30, max_answer_bytes=4096).snapshot()
    assert not snap.ok and "more than 4096 bytes" in snap.error
    many = fake(lambda q: vector(*[(info(f"e{i:03d}") if "info" in q else {"instance": f"e{i:03d}"}, 1)
                                   for i in range(30)]))
    snap = FleetQuery(many.url, timeout_s=30, max_rows=10).snapshot()
    assert snap.ok and len(snap.rows) == 10 and snap.left_out == 20


def test_only_engines_with_the_default_jobs_and_every_target_of_named_jobs(fake):
    def answers(query: str) -> dict:
        if query.startswith("up"):
            return vector(({"instance": "node:9100", "job": "node"}, 1), ({"instance": "a:1", "job": "pagewarden"}, 0))
        return vector((info("a:1"), 1)) if "engine_info" in query else vector()

    prom = fake(answers)
    assert [r.instance for r in FleetQuery(prom.url, timeout_s=30).snapshot().rows] == ["a:1"]
    assert len(FleetQuery(prom.url, "node|pagewarden", timeout_s=30).snapshot().rows) == 2


def test_durations_and_the_scrape_interval():
    assert parse_duration("15s") == 15 and parse_duration("1m30s") == 90 and parse_duration("500ms") == 0.5
    assert parse_duration("soon") is None
    assert scrape_interval_of(CONFIG_YAML) == 5.0
    assert scrape_interval_of("scrape_configs:\n  - job_name: x\n    scrape_interval: 3s\n") is None


# ---- against the real thing: Debian's Prometheus scraping two real engines ------------------

@pytest.mark.e2e
def test_a_real_prometheus_lists_two_real_engines_and_a_killed_one_as_down(tmp_path):
    from engine.client.local_server import write_config
    from engine.config import EngineConfig
    from tests.prometheus_stack import ALERTMANAGER, PROMETHEUS, Stack
    from tests.waiting import wait_for

    if PROMETHEUS is None or ALERTMANAGER is None:
        pytest.skip("apt install prometheus prometheus-alertmanager (.ci/run does)")
    stack = Stack(tmp_path)
    try:
        config = EngineConfig().replace(canaries={"enabled": False})
        healthy = stack.engine("healthy", write_config(tmp_path / "healthy.toml", config))
        faulty = stack.engine("faulty", write_config(tmp_path / "faulty.toml", config,
                                                      defences={"writer_tag_check": False}), "--allow-faults")
        clients = {name: server.client(timeout_s=300) for name, server in stack.engines.items()}
        for name, server in stack.engines.items():
            server.wait_workers(clients[name])
        stack.start_prometheus()
        query = FleetQuery(stack.prometheus, "pagewarden", timeout_s=30)

        def rows() -> dict:
            snap = query.snapshot()
            assert snap.ok, snap.error
            return {r.instance: r for r in snap.rows}

        both = {stack.instance("healthy"), stack.instance("faulty")}
        wait_for(lambda: {i for i, r in rows().items() if r.up and r.role} == both, 60, "both engines in the fleet")
        now = rows()
        assert now[stack.instance("healthy")].control == healthy.control
        assert now[stack.instance("faulty")].control == faulty.control
        assert now[stack.instance("faulty")].defences_off >= 1 and now[stack.instance("healthy")].defences_off == 0
        assert all(r.kind == "PageWarden engine" and r.pools and r.uptime_s for r in now.values())
        assert set(re.findall(r"pagewarden_\w+", " ".join(query.sent))) <= set(metric_names())

        clients["faulty"].close()
        faulty.kill()
        wait_for(lambda: rows()[stack.instance("faulty")].up is False, 30, "the killed engine to read as down")
        down = rows()[stack.instance("faulty")]
        assert down.control == faulty.control  # its last labels: the app can still name it
        clients["healthy"].close()
    finally:
        stack.stop()
