"""The engine's status as Prometheus metrics (text exposition, by prometheus-client).

`exposition(status)` turns one `status` reply into the text format: the HTTP front serves it
at `GET /metrics` (on --http-port, and alone on --metrics-port). Every name is declared once
in METRICS (the Grafana dashboard in resources/grafana/ and its test read them from there).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from engine.wire.alert_kinds import ALERT_KINDS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# name (without the pagewarden_ prefix) -> (type, help)
METRICS = {
    "up": ("gauge", "1 while the engine answers its control socket"),
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
    "workers": ("gauge", "worker processes by role and state"),
    "alerts": ("gauge", "alert records by kind, severity and state"),
    "alerts_fired": ("counter", "times an alert of a kind was raised since start"),
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
        workers = _family("workers", ["role", "state"])
        counts: dict[tuple[str, str], int] = {}
        for w in s.get("workers") or []:
            key = (str(w.get("role")), str(w.get("state")))
            counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            workers.add_metric(list(key), n)
        yield workers
        alerts = _family("alerts", ["kind", "severity", "state"])
        by_alert: dict[tuple[str, str, str], int] = {}
        for a in s.get("alerts") or []:
            if a.get("previous_run"):
                continue  # an earlier run's record: evidence, not this engine's state
            key = (str(a.get("kind")), str(a.get("severity")), str(a.get("state")))
            by_alert[key] = by_alert.get(key, 0) + 1
        for key, n in sorted(by_alert.items()):
            alerts.add_metric(list(key), n)
        yield alerts
        fired = _family("alerts_fired", ["kind"])
        counters = s.get("counters") or {}
        for kind in ALERT_KINDS:
            fired.add_metric([kind.name], float(counters.get(f"alert:{kind.name}", 0)))
        yield fired
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
