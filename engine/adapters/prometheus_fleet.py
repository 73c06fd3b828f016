"""FleetQuery: every engine a Prometheus scrapes, one row each, from its HTTP API (stdlib only).

A refresh is a fixed set of instant queries (`/api/v1/query`) and one range query
(`/api/v1/query_range`: each engine's fullest pool over the last 10 minutes, for a sparkline),
joined by `instance` into `EngineRow`s. Every name a query uses is a metric of
engine/http/prometheus_text.py (`METRICS`) or Prometheus's own `up`.

Isolation alerts: `critical_firing` counts the engine's critical alert records that are
firing (`pagewarden_alerts{state="firing", severity="critical"}`): every critical kind is an
isolation or availability finding, so it is the simplest honest count; data that crossed is
counted apart from the events of crossed="true" kinds and the cross reads of the last 5 minutes.

With the default job_regex (".*") a target is a row only if it said what it is
(engine_info in the last hour), so a Prometheus that also scrapes other exporters lists its
engines only; name the engines' jobs (job_regex) to see every target of them, never-seen ones too.

Errors are values: Prometheus down, slower than `timeout_s` (one deadline for the whole
refresh), or a bad answer come back as `FleetSnapshot.error`, never as an exception. Every
answer is bounded (MAX_ANSWER_BYTES) and so are the rows (MAX_ROWS, the rest counted in
`left_out`).
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_ANSWER_BYTES = 32 * 1024 * 1024
MAX_ROWS = 5_000
HISTORY_S, HISTORY_STEP_S = 600, 15  # the sparkline: 10 minutes, a point every 15 s
HISTORY_POINTS = HISTORY_S // HISTORY_STEP_S + 1
DEFAULT_SCRAPE_S = 15.0
KINDS = {"pagewarden": "PageWarden engine", "vllm_agent": "vLLM agent"}


class FleetError(Exception):
    """One query failed: Prometheus unreachable, slow, or its answer not what the API says."""


@dataclass(frozen=True)
class EngineRow:
    instance: str
    job: str = ""
    role: str = ""  # engine_info's role: "pagewarden" or "vllm_agent" ("" when never seen)
    model: str = ""
    control: str = ""  # the control endpoint the app attaches to
    up: bool | None = None  # Prometheus's own `up` for the target (None: no such target)
    pools: dict[str, float] = field(default_factory=dict)  # pool -> used / total pages
    capacity_exceeds: bool = False  # the context window exceeds a pool (I6)
    critical_firing: int = 0  # critical alert records firing now
    cross_reads_5m: float = 0.0  # reads of another request's data, last 5 minutes
    crossed_events_5m: float = 0.0  # events of kinds that say data may have crossed, last 5 minutes
    restarts_15m: float = 0.0
    restarts_total: float = 0.0
    uptime_s: float | None = None
    defences_off: int = 0
    faults_on: int = 0
    # the fullest pool's usage over HISTORY_S, oldest first, one per step (None: not scraped then)
    usage_history: tuple[float | None, ...] = ()

    @property
    def kind(self) -> str:
        """"PageWarden engine", "vLLM agent", or the role as it came ("?" when unknown)."""
        return KINDS.get(self.role, self.role or "?")


@dataclass(frozen=True)
class FleetSnapshot:
    url: str
    rows: tuple[EngineRow, ...] = ()
    taken: float = 0.0  # time.time() when the refresh ended
    took_s: float = 0.0  # how long the queries took together
    error: str | None = None  # what went wrong; rows are empty then
    left_out: int = 0  # engines past MAX_ROWS, not in rows
    scrape_interval_s: float | None = None  # global.scrape_interval, when the config said it

    @property
    def ok(self) -> bool:
        return self.error is None


def _selector(job_regex: str) -> str:
    return '{job=~"' + job_regex.replace("\\", "\\\\").replace('"', '\\"') + '"}'


def _queries(job_regex: str) -> dict[str, str]:
    """name -> PromQL; each `{SEL}` takes the job matcher."""
    sel = _selector(job_regex)
    inner = sel[1:-1]
    return {
        "up": f"up{sel}",
        # last labels for an engine that went down too (engine_info goes stale after 5 minutes)
        "info": f"last_over_time(pagewarden_engine_info{sel}[1h])",
        "pools": f"pagewarden_pool_usage_ratio{sel}",
        "capacity": f"max by (instance) (pagewarden_capacity_exceeds_window{sel})",
        "critical": f'sum by (instance) (pagewarden_alerts{{state="firing", severity="critical", {inner}}})',
        "cross_reads": f"sum by (instance) (increase(pagewarden_cross_reads_total{sel}[5m]))",
        "crossed": f'sum by (instance) (increase(pagewarden_alert_events_total{{crossed="true", {inner}}}[5m]))',
        "restarts_15m": f"sum by (instance) (increase(pagewarden_worker_restarts_total{sel}[15m]))",
        "restarts": f"sum by (instance) (pagewarden_worker_restarts_total{sel})",
        "uptime": f"max by (instance) (pagewarden_uptime_seconds{sel})",
        "defences_off": f"count by (instance) (pagewarden_defence_on{sel} == 0)",
        "faults_on": f"count by (instance) (pagewarden_fault_on{sel} == 1)",
    }


def history_query(job_regex: str) -> str:
    return f"max by (instance) (pagewarden_pool_usage_ratio{_selector(job_regex)})"


def parse_duration(text: str) -> float | None:
    """Prometheus's duration ("15s", "1m30s", "500ms") in seconds, or None."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        return None
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    return sum(float(n) * scale[u] for n, u in parts)


def scrape_interval_of(config_yaml: str) -> float | None:
    """global.scrape_interval of a Prometheus config (as /api/v1/status/config shows it)."""
    in_global = False
    for line in config_yaml.splitlines():
        if line and not line[0].isspace():
            in_global = line.rstrip() == "global:"
            continue
        match = re.match(r"\s+scrape_interval:\s*(\S+)", line)
        if in_global and match:
            return parse_duration(match.group(1).strip("'\""))
    return None


class FleetQuery:
    def __init__(self, base_url: str, job_regex: str = ".*", *, timeout_s: float = 10.0,
                 max_answer_bytes: int = MAX_ANSWER_BYTES, max_rows: int = MAX_ROWS):
        self.base = base_url.rstrip("/")
        self.job_regex, self.timeout_s = job_regex, timeout_s
        self.max_answer_bytes, self.max_rows = max_answer_bytes, max_rows
        self.sent: list[str] = []  # every PromQL sent (tests check the names)

    # ---- HTTP ----------------------------------------------------------------------------
    def _get(self, path: str, params: dict[str, str], deadline: float) -> dict:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FleetError(f"Prometheus at {self.base} did not answer within {self.timeout_s:g} s")
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=left) as response:
                body = response.read(self.max_answer_bytes + 1)
        except urllib.error.HTTPError as exc:
            body = exc.read(64 * 1024)
            raise FleetError(f"{path} answered HTTP {exc.code}: {_error_of(body)}") from None
        except TimeoutError:
            raise FleetError(f"Prometheus at {self.base} did not answer within {self.timeout_s:g} s") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError) or "timed out" in str(reason):
                raise FleetError(f"Prometheus at {self.base} did not answer within {self.timeout_s:g} s") from None
            raise FleetError(f"cannot reach Prometheus at {self.base}: {reason}") from None
        if len(body) > self.max_answer_bytes:
            raise FleetError(f"{path} answered more than {self.max_answer_bytes} bytes")
        try:
            answer = json.loads(body)
        except ValueError:
            raise FleetError(f"{path} answered something that is not JSON") from None
        if not isinstance(answer, dict) or answer.get("status") != "success" or not isinstance(answer.get("data"), dict):
            raise FleetError(f"{path} failed: {_error_of(body)}")
        return answer["data"]

    def _vector(self, promql: str, deadline: float) -> list[tuple[dict[str, str], float]]:
        self.sent.append(promql)
        data = self._get("/api/v1/query", {"query": promql}, deadline)
        return [(labels, _number(value[1])) for labels, value in _series(data, "vector", "value")]

    def _matrix(self, promql: str, deadline: float) -> list[tuple[dict[str, str], tuple[float | None, ...]]]:
        """Each series on the fixed grid of HISTORY_POINTS steps ending now (None: no sample there)."""
        self.sent.append(promql)
        end = time.time()
        start = end - HISTORY_S
        data = self._get("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}",
                                                 "end": f"{end:.3f}", "step": str(HISTORY_STEP_S)}, deadline)
        out = []
        for labels, values in _series(data, "matrix", "values"):
            grid: list[float | None] = [None] * HISTORY_POINTS
            for t, v in values:
                i, value = round((_number(t) - start) / HISTORY_STEP_S), _number(v)
                if 0 <= i < HISTORY_POINTS and not math.isnan(value):
                    grid[i] = value
            out.append((labels, tuple(grid)))
        return out

    # ---- the refresh ---------------------------------------------------------------------
    def scrape_interval(self, deadline: float) -> float | None:
        """global.scrape_interval from /api/v1/status/config (None: not said, or not allowed)."""
        try:
            data = self._get("/api/v1/status/config", {}, deadline)
        except FleetError:
            return None
        config = data.get("yaml")
        return scrape_interval_of(config) if isinstance(config, str) else None

    def snapshot(self) -> FleetSnapshot:
        """One refresh. Never raises for what Prometheus does: errors are FleetSnapshot.error."""
        start = time.monotonic()
        deadline = start + self.timeout_s
        try:
            rows, left_out = self._rows(deadline)
            interval = self.scrape_interval(deadline)
        except FleetError as exc:
            return FleetSnapshot(self.base, taken=time.time(), took_s=time.monotonic() - start, error=str(exc))
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:  # a shape no check foresaw
            return FleetSnapshot(self.base, taken=time.time(), took_s=time.monotonic() - start,
                                 error=f"unexpected answer from {self.base}: {type(exc).__name__}: {exc}")
        return FleetSnapshot(self.base, tuple(rows), time.time(), time.monotonic() - start, None, left_out, interval)

    def _rows(self, deadline: float) -> tuple[list[EngineRow], int]:
        results = {name: self._vector(q, deadline) for name, q in _queries(self.job_regex).items()}
        fields: dict[str, dict] = {}

        def row(labels: dict[str, str], new: bool = False) -> dict | None:
            """The instance's fields; only `up` and engine_info make a row, the rest join one."""
            instance = labels.get("instance")
            if not instance:
                return None
            if new:
                return fields.setdefault(instance, {"instance": instance, "pools": {}})
            return fields.get(instance)

        for labels, value in results["up"]:
            r = row(labels, new=True)
            if r is not None:
                r["up"], r["job"] = value == 1, labels.get("job", "")
        for labels, _ in results["info"]:
            r = row(labels, new=True)
            if r is not None:
                r.update(role=labels.get("role", ""), model=labels.get("model", ""), control=labels.get("control", ""))
                r.setdefault("job", labels.get("job", ""))
        for labels, value in results["pools"]:
            r = row(labels)
            if r is not None:
                r["pools"][labels.get("pool", "?")] = value
        scalars: dict[str, tuple[str, Callable[[float], object]]] = {"capacity": ("capacity_exceeds", lambda v: v >= 1), "critical": ("critical_firing", int),
                   "cross_reads": ("cross_reads_5m", float), "crossed": ("crossed_events_5m", float),
                   "restarts_15m": ("restarts_15m", float), "restarts": ("restarts_total", float),
                   "uptime": ("uptime_s", float), "defences_off": ("defences_off", int),
                   "faults_on": ("faults_on", int)}
        for name, (key, convert) in scalars.items():
            for labels, value in results[name]:
                r = row(labels)
                if r is not None and not math.isnan(value):  # NaN: no value
                    r[key] = convert(value)
        for labels, values in self._matrix(history_query(self.job_regex), deadline):
            r = row(labels)
            if r is not None:
                r["usage_history"] = values
        if self.job_regex == ".*":  # every job: only targets that ever said they are an engine
            fields = {name: f for name, f in fields.items() if "role" in f}
        names = sorted(fields)
        kept = names[:self.max_rows]
        return [EngineRow(**fields[name]) for name in kept], len(names) - len(kept)


def _series(data: dict, result_type: str, key: str) -> list[tuple[dict[str, str], list]]:
    if data.get("resultType") != result_type or not isinstance(data.get("result"), list):
        raise FleetError(f"expected a {result_type}, got {str(data.get('resultType'))[:40]}")
    out = []
    for item in data["result"]:
        if not isinstance(item, dict) or not isinstance(item.get("metric"), dict) or not isinstance(item.get(key), list):
            raise FleetError(f"a {result_type} item without metric and {key}")
        out.append(({str(k): str(v) for k, v in item["metric"].items()}, item[key]))
    return out


def _number(text: object) -> float:
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise FleetError(f"a sample value that is not a number: {str(text)[:40]!r}") from None


def _error_of(body: bytes) -> str:
    try:
        answer = json.loads(body)
        return str(answer.get("error") or answer)[:300]
    except ValueError:
        return body[:200].decode("utf-8", "replace")
