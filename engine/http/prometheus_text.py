"""The engine's status as Prometheus metrics (text exposition, by prometheus-client).

`exposition(status)` turns one `status` reply into the text format: the HTTP front serves it
at `GET /metrics` (on --http-port, and alone on --metrics-port). Every name is declared once
in METRICS (the Grafana dashboard in resources/grafana/ and its test read them from there).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from engine.wire.alert_kinds import ALERT_KINDS, AlertKind
from engine.wire.defences import DEFENCES, FAULTS
from engine.wire.states import AlertState, WorkerState

WORKER_ROLES = ("prefill", "decode")  # every engine's; a role a status names besides is added

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name (without the pagewarden_ prefix) -> (type, help)
METRICS = {
    "up": ("gauge", "1 while the engine answers its control socket"),
    "engine_info": ("gauge", "1, labelled with what the engine is: version, model, role and control endpoint"),
    "uptime_seconds": ("gauge", "seconds since the engine started"),
    "pool_pages": ("gauge", "pages in a KV pool"),
    "pool_used_pages": ("gauge", "pages in use in a KV pool"),
    "pool_usage_ratio": ("gauge", "used / total pages of a KV pool"),
    "queue_depth": ("gauge", "requests waiting for a worker or pages"),
    "running_requests": ("gauge", "requests being served"),
    "tokens_per_second": ("gauge", "tokens generated in the last second"),
    "generated_tokens": ("counter", "tokens generated since start"),
    "time_to_first_token_seconds": ("histogram", "time to first token per request"),
    "time_per_output_token_seconds": ("histogram", "per request: mean time between its output tokens"),
    "workers": ("gauge", "worker processes by role and state (every state, 0 where none)"),
    "worker_restarts": ("counter", "times a worker process was started again (after a crash, or asked)"),
    "defence_on": ("gauge", "1 while an isolation defence is on, 0 while it is off"),
    "fault_on": ("gauge", "1 while a fault is injected (reproducing an incident), else 0"),
    "alerts": ("gauge", "alert records by kind, severity and state (every declared kind and state, 0 where none)"),
    "alerts_fired": ("counter", "alert episodes of a kind that fired since start: one per episode, however "
                                "many events it gathered"),
    "alert_events": ("counter", "events raised for an alert kind since start (an episode gathers many)"),
    "cross_reads": ("counter", "reads of another request's data (per token slot) reported by the workers"),
    "capacity_exceeds_window": ("gauge", "1 when the advertised context window exceeds a pool's capacity"),
    "telemetry_refused_subscriptions": ("counter", "telemetry subscriptions refused past the limit"),
    "alerts_forwarded": ("counter", "alerts delivered to the Alertmanager webhook (resends included)"),
    "alert_forward_failures": ("counter", "POSTs to the Alertmanager webhook that failed (each retry counts)"),
    "alerts_forward_dropped": ("counter", "alerts never delivered to the webhook: past the bound, or refused (4xx)"),
    "alert_forward_queue": ("gauge", "alerts waiting for their first delivery to the Alertmanager webhook"),
    "journal_records": ("counter", "evidence records written to the journal"),
    "journal_dropped": ("counter", "evidence records never written: the journal's queue was full"),
    "journal_lost": ("counter", "evidence records whose write failed (disk full, read-only file)"),
    "journal_ok": ("gauge", "1 while the evidence journal is open and its last write succeeded"),
    "journal_bytes": ("gauge", "size of the evidence journal on disk (file and WAL)"),
}
PREFIX = "pagewarden_"


def metric_names() -> list[str]:
    """Every sample name a scrape can hold (histograms: _bucket, _sum, _count; counters: _total)."""
    out = []
    for name, (kind, _help) in METRICS.items():
        full = PREFIX + name
        if kind == "histogram":
            out += [full + "_bucket", full + "_sum", full + "_count"]
        elif kind == "counter":
            out.append(full + "_total")
        else:
            out.append(full)
    return out


def _family(name: str, labels: list[str] | None = None):
    kind, text = METRICS[name]
    cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}[kind]
    return cls(PREFIX + name, text, labels=labels or [])


class _StatusCollector:
    def __init__(self, status: dict):
        self.status = status

    def collect(self):
        s = self.status
        engine, load = s.get("engine") or {}, s.get("load") or {}
        metrics = s.get("metrics") or {}
        up = _family("up")
        up.add_metric([], 1.0)
        yield up
        info = _family("engine_info", ["version", "model", "role", "control"])
        info.add_metric([str(engine.get("version") or ""), str(engine.get("model") or ""),
                         str(engine.get("role") or "pagewarden"), str(engine.get("control") or "")], 1.0)
        yield info
        uptime = _family("uptime_seconds")
        uptime.add_metric([], float(engine.get("uptime_s") or 0.0))
        yield uptime
        pages, used, ratio = _family("pool_pages", ["pool", "role"]), _family("pool_used_pages", ["pool", "role"]), \
            _family("pool_usage_ratio", ["pool", "role"])
        for pool, p in sorted((load.get("pools") or {}).items()):
            total, in_use = int(p.get("pages") or 0), int(p.get("used_pages") or 0)
            labels = [pool, str(p.get("role") or "")]
            pages.add_metric(labels, total)
            used.add_metric(labels, in_use)
            ratio.add_metric(labels, in_use / total if total else 0.0)
        yield from (pages, used, ratio)
        for name, value in (("queue_depth", load.get("queue_depth")), ("running_requests", load.get("running")),
                            ("tokens_per_second", metrics.get("tokens_per_s"))):
            family = _family(name)
            family.add_metric([], float(value or 0))
            yield family
        tokens = _family("generated_tokens")
        tokens.add_metric([], float(metrics.get("tokens_total") or 0))
        yield tokens
        for name, key in (("time_to_first_token_seconds", "ttft_seconds"),
                          ("time_per_output_token_seconds", "tpot_seconds")):
            hist = metrics.get(key) or {"buckets": [["+Inf", 0]], "sum": 0.0, "count": 0}
            family = _family(name)
            family.add_metric([], [(_le(b), c) for b, c in hist["buckets"]], sum_value=float(hist["sum"]))
            yield family
        yield from _workers(s.get("workers"))
        yield from _switches(s.get("config"))
        yield from _alerts(s)
        cross = _family("cross_reads")
        cross.add_metric([], float((s.get("cross_reads") or {}).get("total", 0)))
        yield cross
        exceeds = _family("capacity_exceeds_window", ["limit"])
        for finding in s.get("capacity") or []:
            exceeds.add_metric([str(finding.get("limit"))], 1.0 if finding.get("exceeds") else 0.0)
        yield exceeds
        refused = _family("telemetry_refused_subscriptions")
        refused.add_metric([], float((s.get("telemetry") or {}).get("refused_subscriptions", 0)))
        yield refused
        forwarding = s.get("alert_forwarding") or {}
        for name, key in (("alerts_forwarded", "sent"), ("alert_forward_failures", "failed"),
                          ("alerts_forward_dropped", "dropped"), ("alert_forward_queue", "queued")):
            family = _family(name)
            family.add_metric([], float(forwarding.get(key) or 0))
            yield family
        evidence = s.get("evidence") or {}
        for name, key in (("journal_records", "written"), ("journal_dropped", "dropped"), ("journal_lost", "lost"),
                          ("journal_bytes", "bytes")):
            family = _family(name)
            family.add_metric([], float(evidence.get(key) or 0))
            yield family
        ok = _family("journal_ok")
        ok.add_metric([], 1.0 if evidence.get("journal") and not evidence.get("error") else 0.0)
        yield ok


def _workers(listed: list | None):
    """Every (role, state) pair, 0 where no worker is in it: a rule on state="ready" must read
    0, not find nothing, when none is; and each worker's restarts."""
    workers = _family("workers", ["role", "state"])
    restarts = _family("worker_restarts", ["worker", "role"])
    listed = listed if isinstance(listed, list) else []
    counts: dict[tuple[str, str], int] = {}
    roles = list(WORKER_ROLES) if any(w.get("role") in WORKER_ROLES for w in listed) else []
    for w in listed:
        role, state = str(w.get("role")), str(w.get("state"))
        counts[(role, state)] = counts.get((role, state), 0) + 1
        roles += [role] if role not in roles else []
        restarts.add_metric([str(w.get("name")), role], float(w.get("restarts") or 0))
    states = [s.value for s in WorkerState] + sorted({state for _, state in counts} - {s.value for s in WorkerState})
    if listed:  # an engine without workers of its own (the vLLM agent) has no such gauge
        for role in roles:
            for state in states:
                workers.add_metric([role, state], counts.get((role, state), 0))
    yield from (workers, restarts)


def _switches(config: dict | None):
    """Each declared defence and fault, 1 or 0, from the config the status shows (none without it)."""
    defences, faults = _family("defence_on", ["defence"]), _family("fault_on", ["fault"])
    if isinstance(config, dict):
        for family, switches, section, default in ((defences, DEFENCES, "defences", True),
                                                  (faults, FAULTS, "faults", False)):
            values = config.get(section) or {}
            for switch in switches:
                family.add_metric([switch.name], 1.0 if values.get(switch.name, default) else 0.0)
    yield from (defences, faults)


def _alerts(s: dict):
    """Records by kind, severity and state (every declared kind and state, 0 where none), episodes
    that fired and events raised, per kind."""
    alerts = _family("alerts", ["kind", "severity", "state"])
    by_alert: dict[tuple[str, str, str], int] = {}
    for a in s.get("alerts") or []:
        if a.get("previous_run"):
            continue  # an earlier run's record: evidence, not this engine's state
        key = (str(a.get("kind")), str(a.get("severity")), str(a.get("state")))
        by_alert[key] = by_alert.get(key, 0) + 1
    for kind in ALERT_KINDS:
        for state in AlertState:
            by_alert.setdefault((kind.name, kind.severity, state.value), 0)
    for key, n in sorted(by_alert.items()):
        alerts.add_metric(list(key), n)
    # crossed="true": a kind whose firing says data may have crossed between requests (a rule or
    # a panel selects on it, and needs no edit when such a kind is declared)
    fired, events = _family("alerts_fired", ["kind", "crossed"]), _family("alert_events", ["kind", "crossed"])
    counters, episodes = s.get("counters") or {}, s.get("alert_episodes") or {}
    for kind in ALERT_KINDS:
        labels = [kind.name, "true" if crossed(kind) else "false"]
        fired.add_metric(labels, float(episodes.get(kind.name, 0)))
        events.add_metric(labels, float(counters.get(f"alert:{kind.name}", 0)))
    yield from (alerts, fired, events)


def crossed(kind: AlertKind) -> bool:
    """An isolation kind that detects a cross-request read and whose firing does not itself say
    the read was stopped: where data may have crossed."""
    return kind.isolation and kind.detects_cross_reads and not kind.prevented_by_firing


def _le(bound) -> str:
    return "+Inf" if bound == "+Inf" else repr(float(bound))


def metrics_handler(link):
    """An aiohttp handler for GET /metrics: one `status` call to the engine, as Prometheus text."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        status = await link.call("status")
        return web.Response(body=exposition(status), headers={"Content-Type": CONTENT_TYPE})

    return handle


def metrics_app(link):
    """The app of --metrics-port: /metrics alone."""
    from aiohttp import web

    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(link))
    return app


def exposition(status: dict) -> bytes:
    """The Prometheus text format of one `status` reply."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StatusCollector(status))
    return generate_latest(registry)
