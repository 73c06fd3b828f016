"""`report.html` of an incident snapshot: one self-contained HTML5 page built from the
manifest, the state (docs/SNAPSHOT.md) and the page-map PNGs.

No JavaScript and no external resources: inline CSS, images as base64 data URIs, so it
opens in any browser, offline, years later. Every string from the engine or the network
(request ids, tenants, details) goes through html.escape.

Pure Python (no Qt).
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from datetime import datetime, timezone
from html import escape

from engine.wire.alert_kinds import ISOLATION_KINDS
from gui.snapshot.trace import request_spans

PRIVACY = ("No prompt or output text is ever written, except canary markers (which are random and exist "
           "to be found). Prompts appear as length and a hash.")
MAX_ROWS = 500  # per table; the JSON files hold everything
MAX_LANES = 40  # requests drawn in the timeline chart
FAILED_PHASES = ("failed", "rejected")
PHASES = ("queued", "reserving", "awaiting_prefill", "prefilling", "decoding", "finished", "failed", "rejected",
          "cancelled")
END_PHASES = ("finished", "failed", "rejected", "cancelled")
SPAN_COLOURS = {"queue": "#9aa3ad", "prefill": "#3d7bd9", "transfer": "#c26a00", "decode": "#23803f"}

CSS = """
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 -apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
 color:#1d1d1f;background:#f4f5f7}
header{background:#1f2226;color:#e6e6e6;padding:22px 32px 18px}
header h1{margin:0 0 6px;font-size:22px;font-weight:600;color:#fff}
header .meta{display:flex;flex-wrap:wrap;gap:4px 28px;font-size:13px;color:#b8bcc2}
header .meta b{color:#e6e6e6;font-weight:600}
main{padding:8px 32px 40px;max-width:1400px}
section{background:#fff;border:1px solid #dfe2e6;border-radius:6px;padding:14px 18px;margin:16px 0}
h2{font-size:16px;margin:0 0 10px;color:#2b2f36}
h3{font-size:14px;margin:14px 0 6px;color:#2b2f36}
.nw{white-space:nowrap}
.headline{font-size:20px;font-weight:600;margin:0}
.headline.bad{color:#b3261e}.headline.ok{color:#23803f}
.privacy{border-left:4px solid #3d7bd9;background:#eef4fd}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #e6e8eb;vertical-align:top}
th{background:#eceef1;font-weight:600;color:#3a3f47;white-space:nowrap}
th.num{text-align:right}
tbody tr:nth-child(even){background:#f7f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.mono,code{font-family:"SFMono-Regular",Menlo,Consolas,monospace;font-size:12px;overflow-wrap:break-word}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;color:#fff}
.b-critical,.b-failed,.b-firing,.b-yes{background:#b3261e}
.b-warning,.b-pending,.b-rejected{background:#c26a00}
.b-info{background:#1d5fbf}
.b-resolved,.b-finished,.b-no,.b-acknowledged{background:#23803f}
.b-other{background:#7a7a80}
.muted{color:#7a7a80}
.warn{color:#b3261e;font-weight:600}
.grid{display:flex;flex-wrap:wrap;gap:16px}
.grid>div{flex:1 1 300px;min-width:0}
figure{margin:0 0 12px}
figure img{max-width:100%;image-rendering:pixelated;border:1px solid #dfe2e6}
figcaption{font-size:12px;color:#5a5f66}
pre{background:#f7f8fa;border:1px solid #e6e8eb;padding:10px;margin:0;overflow:auto;font-size:12px}
.lanes{font-size:12px;margin:8px 0 16px}
.lane{display:flex;align-items:center;height:22px}
.lane .badge{flex:0 0 92px;text-align:center;font-size:11px;padding:0 4px;margin-right:8px}
.lane .id{flex:0 0 200px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap;padding-right:8px}
.lane .track{position:relative;flex:1;height:12px;background:#f0f1f3}
.lane .span{position:absolute;top:0;height:12px;min-width:2px}
.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px}
"""


class _Html(str):
    """A string that is already HTML (built here from escaped parts)."""


def _e(value) -> str:
    if isinstance(value, _Html):
        return value
    if value is None:
        return ""
    if isinstance(value, float):
        value = f"{value:,.3f}".rstrip("0").rstrip(".")
    elif isinstance(value, bool):
        value = "yes" if value else "no"
    elif isinstance(value, int):
        value = f"{value:,}"
    elif isinstance(value, (list, tuple)):
        value = ", ".join(str(v) for v in value)
    return escape(str(value))


def utc(t) -> str:
    """Unix seconds as UTC ISO 8601 with milliseconds, e.g. 2026-12-02T19:30:00.123Z."""
    if not isinstance(t, (int, float)):
        return ""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _time(t) -> _Html:
    """A UTC time that does not wrap in a table cell."""
    return _Html(f'<span class="nw">{_e(utc(t))}</span>')


def _badge(text, kind: str | None = None) -> _Html:
    """A coloured pill; its colour from `kind`, or from the text itself when it is a known state."""
    known = ("critical", "warning", "info", "failed", "firing", "pending", "rejected", "resolved", "finished",
             "acknowledged", "yes", "no")
    text = _e(text)
    kind = kind or (text if text in known else "other")
    return _Html(f'<span class="badge b-{kind}">{text}</span>')


def _code(value) -> _Html:
    return _Html(f'<span class="mono">{_e(value)}</span>')


def _table(headers: list[str], rows: list[list], empty: str = "None.", numeric: tuple[int, ...] = ()) -> str:
    if not rows:
        return f'<p class="muted">{_e(empty)}</p>'
    head = "".join(f'<th class="num">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for row in rows[:MAX_ROWS]:
        cells = "".join(f'<td class="num">{_e(c)}</td>' if i in numeric else f"<td>{_e(c)}</td>"
                        for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    more = f'<p class="muted">{len(rows) - MAX_ROWS:,} more rows in the JSON files.</p>' if len(rows) > MAX_ROWS else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{more}"


def _section(title: str, body: str, cls: str = "") -> str:
    return f'<section class="{cls}"><h2>{_e(title)}</h2>{body}</section>'


def phase(request: dict) -> str:
    """A request's phase; where the record has none of PHASES (a request the engine no longer
    tracks, known by its events only), its last ending event, else what it says."""
    value = str(request.get("phase"))
    if value in PHASES:
        return value
    ends = [e.get("event") for e in request.get("events") or [] if e.get("event") in END_PHASES]
    return ends[-1] if ends else value


def crossed_alerts(state: dict) -> list[dict]:
    """Isolation alerts that say data crossed and was not prevented."""
    return [a for a in state.get("alerts") or []
            if a.get("kind") in ISOLATION_KINDS and a.get("prevented") is False]


def headline(state: dict) -> str:
    """The one-sentence summary (plain text): how many responses were affected, and when.
    Never "nothing crossed" beside an alert that says data did."""
    pairs = (state.get("scope") or {}).get("pairs") or []
    readers = {p.get("reader") for p in pairs if p.get("reader") is not None}
    if not readers:
        window = state.get("window") or {}
        between = f"between {utc(window.get('since'))} and {utc(window.get('until'))}"
        crossed = crossed_alerts(state)
        if crossed:
            return (f"{len(crossed)} isolation alert(s) say data crossed (not prevented), but no cross read "
                    f"was logged {between}: export a wider window to scope them")
        return f"No cross-request reads were recorded {between}"
    first = min((p["first"] for p in pairs if isinstance(p.get("first"), (int, float))), default=None)
    last = max((p["last"] for p in pairs if isinstance(p.get("last"), (int, float))), default=None)
    noun = "response" if len(readers) == 1 else "responses"
    return f"{len(readers)} {noun} affected between {utc(first)} and {utc(last)}"


def _header(manifest: dict, state: dict) -> str:
    engine = state.get("engine") or {}
    hosts = manifest.get("hostnames") or {}
    window = manifest.get("window") or state.get("window") or {}
    items = [("Model", manifest.get("model") or engine.get("model")),
             ("Architecture", manifest.get("architecture")),
             ("Engine host", hosts.get("engine")), ("Exported from", hosts.get("exporter")),
             ("Endpoint", manifest.get("endpoint")), ("Created", manifest.get("created_utc")),
             ("Window", f"{utc(window.get('since'))} \u2013 {utc(window.get('until'))}"),
             ("Versions", f"app {manifest.get('app_version', '?')}, engine {manifest.get('engine_version', '?')}")]
    meta = "".join(f"<span>{_e(k)}: <b>{_e(v)}</b></span>" for k, v in items if v)
    return f'<header><h1>PageWarden incident snapshot</h1><div class="meta">{meta}</div></header>'


def _summary(state: dict) -> str:
    text = headline(state)
    cls = "ok" if text.startswith("No ") else "bad"
    scope = state.get("scope") or {}
    alerts = state.get("alerts") or []
    firing = sum(a.get("state") == "firing" for a in alerts)
    failed = sum(phase(r) == "failed" for r in state.get("requests") or [])
    facts = (f"{len(scope.get('pairs') or [])} affected pair(s), {scope.get('reads', 0):,} cross-request read(s) "
             f"in total; {len(alerts)} alert(s), {firing} firing; {failed} failed request(s).")
    return _section("Summary", f'<p class="headline {cls}">{_e(text)}</p><p>{_e(facts)}</p>')


def _privacy(manifest: dict) -> str:
    """The bundle's own privacy statement (the manifest's), or PRIVACY when it has none."""
    return _section("Privacy", f"<p>{_e(manifest.get('privacy') or PRIVACY)}</p>", "privacy")


def _images(images: dict[str, bytes]) -> str:
    if not images:
        return ""
    figures = []
    for name in sorted(images):
        data = base64.b64encode(images[name]).decode("ascii")
        figures.append(f'<figure><img src="data:image/png;base64,{data}" alt="{_e(name)}">'
                       f"<figcaption>{_e(name)}</figcaption></figure>")
    return _section("Page maps", "".join(figures))


def _pairs(state: dict) -> str:
    scope = state.get("scope") or {}
    pairs = scope.get("pairs") or []
    rows = [[_code(p.get("reader")), _code(p.get("source") if p.get("source") is not None
                                           else f"unknown (slot {p.get('source_slot')})"),
             ", ".join(f"{pool}:{page}" for pool, page in p.get("pages") or []),
             _time(p.get("first")), _time(p.get("last")), p.get("reads")] for p in pairs]
    crossed = crossed_alerts(state)
    if crossed:  # never "nothing crossed" beside an alert that says it did
        empty = (f"No cross read was logged in this window, but {len(crossed)} isolation alert(s) say data "
                 f"crossed and was not prevented (see Alerts): export a wider window to scope them.")
    else:
        empty = "No request read another request's data in this window."
    note = ""
    if scope.get("incomplete_before") is not None:
        note = (f'<p class="warn">Incomplete: {scope.get("dropped_reads", 0):,} reads up to '
                f"{_e(_time(scope['incomplete_before']))} were dropped for room; pairs before then may be "
                f"missing.</p>")
    return _section("Affected pairs (reader received data written by source)",
                    note + _table(["Reader", "Source", "Pages", "First", "Last", "Reads"], rows, empty, numeric=(5,)))


def _alerts(state: dict) -> str:
    rows = [[a.get("kind"), _badge(a.get("severity")), _badge(a.get("state")), a.get("subject"),
             _time(a.get("first_seen")), _time(a.get("last_seen")), a.get("count"), _badge(bool(a.get("acked"))),
             a.get("detail")] for a in state.get("alerts") or []]
    return _section("Alerts", _table(["Kind", "Severity", "State", "Subject", "First seen", "Last seen",
                                      "Count", "Acked", "Detail"], rows, "No alerts.", numeric=(6,)))


def _timeline_rows(state: dict) -> list[tuple[float, str, object, str, str]]:
    """(time, what, badge text, subject, detail) of alert transitions, request failures and
    rejections, and engine events, in time order."""
    rows = []
    for a in state.get("alerts") or []:
        for t in a.get("transitions") or []:
            if len(t) >= 2 and isinstance(t[1], (int, float)):
                rows.append((t[1], f"alert {a.get('kind')}", t[0], a.get("subject"), a.get("detail")))
    for r in state.get("requests") or []:
        for ev in r.get("events") or []:
            if ev.get("event") in FAILED_PHASES and isinstance(ev.get("time"), (int, float)):
                err = ev.get("error") if isinstance(ev.get("error"), dict) else {}
                detail = err.get("message") or ev.get("message") or ev.get("reason") or ""
                rows.append((ev["time"], "request", ev["event"], r.get("request_id"), detail))
    for group in state.get("engine_events") or []:
        for ev in group.get("events") or []:
            if isinstance(ev.get("time"), (int, float)):
                rows.append((ev["time"], "engine", ev.get("event"), group.get("subject"), ev.get("reason") or ""))
    return sorted(rows, key=lambda row: row[0])


def _lanes(state: dict) -> str:
    """A pure-CSS chart of request lifecycles: affected and failed requests first."""
    window = state.get("window") or {}
    since, until = window.get("since"), window.get("until")
    if not isinstance(since, (int, float)) or not isinstance(until, (int, float)) or until <= since:
        return ""
    involved = {p.get("reader") for p in (state.get("scope") or {}).get("pairs") or []}
    involved |= {p.get("source") for p in (state.get("scope") or {}).get("pairs") or []}
    requests = sorted((r for r in state.get("requests") or [] if request_spans(r)),
                      key=lambda r: (r.get("request_id") not in involved, phase(r) != "failed",
                                     r.get("arrival") or 0))[:MAX_LANES]
    if not requests:
        return ""
    span = until - since
    lanes = []
    for r in sorted(requests, key=lambda r: r.get("arrival") or 0):
        bars, spans = [], request_spans(r)
        if phase(r) == "decoding" and spans and spans[-1][0] == "transfer":
            spans.append(("decode", spans[-1][1], spans[-1][3], until))  # still decoding at the end
        for name, worker, start, end in spans:
            left = min(max(0.0, (start - since) / span), 1.0)
            width = min(max(0.0, (end - start) / span), 1.0 - left)
            bars.append(f'<div class="span" title="{_e(name)} on {_e(worker or "supervisor")}" '
                        f'style="left:{left * 100:.3f}%;width:{width * 100:.3f}%;'
                        f'background:{SPAN_COLOURS[name]}"></div>')
        lanes.append(f'<div class="lane">{_badge(phase(r))}<div class="id mono">{_e(r.get("request_id"))}'
                     f'</div><div class="track">{"".join(bars)}</div></div>')
    legend = "".join(f'<span><i style="background:{c}"></i>{_e(n)}</span>' for n, c in SPAN_COLOURS.items())
    note = f"{len(requests)} of {len(state.get('requests') or [])} requests, window {utc(since)} \u2013 {utc(until)}"
    return (f'<div class="legend">{legend}<span class="muted">{_e(note)}</span></div>'
            f'<div class="lanes">{"".join(lanes)}</div>')


def _timeline(state: dict) -> str:
    since = (state.get("window") or {}).get("since") or 0.0
    rows = [[_time(t), _Html(f'<span class="nw">+{t - since:,.3f} s</span>'), what, _badge(state_), _code(subject),
             detail] for t, what, state_, subject, detail in _timeline_rows(state)]
    table = _table(["Time (UTC)", "Offset", "What", "State", "Subject", "Detail"], rows,
                   "No alert transitions, failures or engine events.")
    return _section("Timeline", _lanes(state) + table)


def _capacity(state: dict) -> str:
    rows = []
    for f in state.get("capacity") or []:
        coverage = f.get("coverage")
        verdict = _badge("exceeds", "critical") if f.get("exceeds") else _badge("fits", "finished")
        rows.append([f.get("limit"), verdict, f.get("window_tokens"), f.get("limit_tokens"), f.get("shortfall_tokens"),
                     f"{coverage:.1%}" if isinstance(coverage, (int, float)) else "",
                     f.get("message") or f.get("detail")])
    return _section("Capacity findings", _table(["Limit", "Verdict", "Window tokens", "Limit tokens", "Shortfall",
                                                 "Coverage", "Finding"], rows, "No capacity findings.",
                                                numeric=(2, 3, 4, 5)))


def _workers(state: dict) -> str:
    rows = []
    for w in state.get("workers") or []:
        pool = w.get("pool") if isinstance(w.get("pool"), dict) else {}
        pages = f"{pool.get('used_pages', '?')} / {pool.get('pages', '?')}" if pool else ""
        rows.append([w.get("name"), w.get("role"), w.get("state"), _e(str(w.get("pid") or "")), w.get("device"), pages,
                     w.get("restarts"), w.get("reason")])
    return _section("Workers", _table(["Name", "Role", "State", "PID", "Device", "Pages used / total",
                                       "Restarts", "Reason"], rows, "No workers.", numeric=(3, 6)))


def _requests(state: dict) -> str:
    requests = state.get("requests") or []
    phases = Counter(phase(r) for r in requests)
    by_tenant: dict[str, Counter] = {}
    for r in requests:
        by_tenant.setdefault(str(r.get("tenant") or "(unknown)"), Counter())[phase(r)] += 1
    cols = sorted(phases)
    tenant_rows = [[t, sum(c.values()), *[c.get(p, 0) for p in cols]] for t, c in sorted(by_tenant.items())]
    failed = []
    for r in requests:
        if phase(r) in FAILED_PHASES:
            err = r.get("error") if isinstance(r.get("error"), dict) else {}
            end = next((e for e in reversed(r.get("events") or []) if e.get("event") in FAILED_PHASES), {})
            failed.append([_code(r.get("request_id")), _badge(phase(r)), r.get("tenant"),
                           r.get("decode_worker"), err.get("code") or end.get("code"),
                           err.get("message") or end.get("message"), _time(end.get("time"))])
    counters = state.get("counters") or {}
    body = (f"<p>{len(requests):,} request(s) in the window.</p>"
            '<div class="grid"><div><h3>By phase</h3>'
            + _table(["Phase", "Requests"], [[p, n] for p, n in sorted(phases.items())], numeric=(1,))
            + "</div><div><h3>Engine counters</h3>"
            + _table(["Counter", "Value"], [[k, v] for k, v in sorted(counters.items())], numeric=(1,))
            + "</div></div><h3>By tenant</h3>"
            + _table(["Tenant", "Total", *cols], tenant_rows, numeric=tuple(range(1, len(cols) + 2)))
            + "<h3>Failed and rejected</h3>"
            + _table(["Request", "Phase", "Tenant", "Decode worker", "Code", "Message", "When"], failed,
                     "No request failed or was rejected."))
    return _section("Requests", body)


def _prompt_log(state: dict) -> str:
    rows = [[_time(p.get("time")), _code(p.get("request_id")), p.get("tenant"), p.get("model"), p.get("prompt_len"),
             _code(p.get("prompt_hash")), p.get("data_tier")] for p in state.get("prompt_log") or []]
    return _section("Prompt log (length and hash only)",
                    _table(["Time", "Request", "Tenant", "Model", "Prompt tokens", "Prompt hash", "Data tier"],
                           rows, "No prompts in this window.", numeric=(4,)))


def _config(manifest: dict, state: dict) -> str:
    config = manifest.get("config") or {}
    text = json.dumps(config, indent=2, sort_keys=True, default=str)
    engine = json.dumps(state.get("engine") or {}, indent=2, sort_keys=True, default=str)
    return _section("Engine configuration", f'<div class="grid"><div><h3>Configuration</h3><pre>{_e(text)}</pre>'
                    f"</div><div><h3>Engine status</h3><pre>{_e(engine)}</pre></div></div>")


def _files(manifest: dict) -> str:
    rows = [[f.get("name"), f.get("bytes"), _code(f.get("sha256"))] for f in manifest.get("files") or []]
    return _section("Files in this bundle (SHA-256)", _table(["File", "Bytes", "SHA-256"], rows,
                                                             "No files listed.", numeric=(1,)))


def render_report(manifest: dict, state: dict, images: dict[str, bytes]) -> str:
    """The whole report.html: `images` maps PNG file names (pagemap-<pool>.png) to bytes."""
    title = f"PageWarden incident snapshot \u2013 {manifest.get('created_utc', '')}"
    parts = [_summary(state), _privacy(manifest), _pairs(state), _alerts(state), _timeline(state),
             _images(images), _capacity(state), _workers(state), _requests(state), _prompt_log(state),
             _config(manifest, state), _files(manifest)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{_e(title)}</title>"
            f"<style>{CSS}</style></head><body>{_header(manifest, state)}<main>{''.join(parts)}</main></body></html>\n")
