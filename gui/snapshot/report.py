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

from engine.wire.states import FAILED_PHASES, AlertState, Phase
from gui.snapshot import first_crossing, report_incident
from gui.snapshot.incident_facts import (
    NOT_PREVENTED,
    failed_requests,
    is_placeholder,
    outcome,
    phase,
    placeholder_requests,
    rejected_requests,
    rejection_of,
)
from gui.snapshot.report_html import CSS, Html, badge, code, esc, section, table, time_cell, utc
from gui.snapshot.trace import request_spans

PRIVACY = ("No prompt or output text is ever written, except canary markers (which are random and exist "
           "to be found). Prompts appear as length and a hash.")
MAX_LANES = 40  # requests drawn in the timeline chart
TIMELINE_REQUEST_EVENTS = ("failed", "rejected", "placeholder")
PROMPT_LOG_CAP = 10_000  # entries the engine's prompt_log op sends at most
SPAN_COLOURS = {"queue": "#9aa3ad", "prefill": "#3d7bd9", "transfer": "#c26a00", "decode": "#23803f"}


def crossed_alerts(state: dict) -> list[dict]:
    """Isolation alert episodes not shown prevented: data may have reached a response."""
    return [e.record for e in outcome(state).reached]


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
            return (f"{len(crossed)} isolation alert(s) say data crossed (not shown prevented), but no cross "
                    f"read was logged {between}: export a wider window to scope them")
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
    meta = "".join(f"<span>{esc(k)}: <b>{esc(v)}</b></span>" for k, v in items if v)
    return f'<header><h1>PageWarden incident snapshot</h1><div class="meta">{meta}</div></header>'


def _summary(state: dict) -> str:
    text = headline(state)
    cls = "ok" if text.startswith("No ") else "bad"
    scope = state.get("scope") or {}
    alerts = state.get("alerts") or []
    ids = {a.get("id") for a in alerts}
    firing = sum(a.get("state") == AlertState.FIRING for a in alerts)
    placeholders, refused = placeholder_requests(state), rejected_requests(state)
    facts = (f"{len(scope.get('pairs') or [])} affected pair(s), {scope.get('reads', 0):,} cross-request read(s) "
             f"in total; {len(alerts)} alert episode(s) of {len(ids)} alert(s), {firing} firing; "
             f"{len(placeholders)} request(s) rejected by admission but served from a placeholder, "
             f"{len(refused)} rejected, {len(failed_requests(state))} failed.")
    return section("Summary", f'<p class="headline {cls}">{esc(text)}</p><p>{esc(facts)}</p>')


def _privacy(manifest: dict) -> str:
    """The bundle's own privacy statement (the manifest's), or PRIVACY when it has none."""
    return section("Privacy", f"<p>{esc(manifest.get('privacy') or PRIVACY)}</p>", "privacy")


def _figure(name: str, data: bytes, caption: str) -> str:
    encoded = base64.b64encode(data).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{encoded}" alt="{esc(name)}">'
            f"<figcaption>{esc(caption)} ({esc(name)})</figcaption></figure>")


def _page_maps(manifest: dict, state: dict, images: dict[str, bytes]) -> str:
    """Per pool, the map at the first crossing beside the map at export time; where the first
    is missing, why, so that the export-time map is never taken for the leak."""
    if not images:
        return ""
    kept = state.get("first_crossing") if isinstance(state.get("first_crossing"), dict) else {}
    maps = kept.get("maps") if isinstance(kept.get("maps"), list) else []
    crossing = {m.get("pool"): m for m in maps if isinstance(m, dict)}
    at_export = {n[len("pagemap-"):-len(".png")]: n for n in images
                 if n.startswith("pagemap-") and not n.startswith(first_crossing.PNG_PREFIX)}
    pools = sorted(set(at_export) | {n[len(first_crossing.PNG_PREFIX):-len(".png")] for n in images
                                     if n.startswith(first_crossing.PNG_PREFIX)})
    crossed = outcome(state).kind == NOT_PREVENTED
    why = kept.get("missing") or "its state.json does not say why" if "first_crossing" in state else (
        "this bundle was exported before snapshots kept the page maps at the first crossing")
    if not crossing and not crossed:
        intro = ("<p>No data crossed in this window: there is no first crossing to show; the maps are at export "
                 "time.</p>")
    elif not crossing:
        intro = (f'<p class="warn">The page maps at the first crossing are not available: {esc(why)}. The maps '
                 f"below are the pools at export time ({esc(manifest.get('created_utc') or '?')}), after the "
                 "incident: leaked pages are freed within seconds, so these maps do not show the leak.</p>")
    else:
        intro = ("<p>Left: the pool at the first crossing (white dots: pages one request owned and another last "
                 "wrote). Right: the same pool at export time, after the incident.</p>")
    rows = []
    for pool in pools:
        left = '<div class="absent">No map of this pool at the first crossing.</div>'
        name = first_crossing.png_name(pool)
        if name in images:
            when = utc((crossing.get(pool) or {}).get("time"))
            left = _figure(name, images[name], f"{pool} at the first crossing, {when or 'time unknown'}")
        right = '<div class="absent">No map of this pool at export time.</div>'
        if pool in at_export:
            right = _figure(at_export[pool], images[at_export[pool]],
                            f"{pool} at export time, {manifest.get('created_utc') or 'time unknown'}")
        rows.append(f'<div class="maps">{left}{right}</div>' if crossing or name in images else right)
    return section("Page maps", intro + "".join(rows), anchor="page-maps")


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
            if ev.get("event") in TIMELINE_REQUEST_EVENTS and isinstance(ev.get("time"), (int, float)):
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
        if phase(r) == Phase.DECODING and spans and spans[-1][0] == "transfer":
            spans.append(("decode", spans[-1][1], spans[-1][3], until))  # still decoding at the end
        for name, worker, start, end in spans:
            left = min(max(0.0, (start - since) / span), 1.0)
            width = min(max(0.0, (end - start) / span), 1.0 - left)
            bars.append(f'<div class="span" title="{esc(name)} on {esc(worker or "supervisor")}" '
                        f'style="left:{left * 100:.3f}%;width:{width * 100:.3f}%;'
                        f'background:{SPAN_COLOURS[name]}"></div>')
        lanes.append(f'<div class="lane">{badge(phase(r))}<div class="id mono">{esc(r.get("request_id"))}'
                     f'</div><div class="track">{"".join(bars)}</div></div>')
    legend = "".join(f'<span><i style="background:{c}"></i>{esc(n)}</span>' for n, c in SPAN_COLOURS.items())
    note = f"{len(requests)} of {len(state.get('requests') or [])} requests, window {utc(since)} \u2013 {utc(until)}"
    return (f'<div class="legend">{legend}<span class="muted">{esc(note)}</span></div>'
            f'<div class="lanes">{"".join(lanes)}</div>')


def _timeline(state: dict) -> str:
    since = (state.get("window") or {}).get("since") or 0.0
    rows = [[time_cell(t), Html(f'<span class="nw">+{t - since:,.3f} s</span>'), what, badge(state_), code(subject),
             detail] for t, what, state_, subject, detail in _timeline_rows(state)]
    events = table(["Time (UTC)", "Offset", "What", "State", "Subject", "Detail"], rows,
                   "No alert transitions, failures, rejections or engine events.", what="events")
    return section("Timeline", _lanes(state) + events)


def _capacity(state: dict) -> str:
    rows = []
    for f in state.get("capacity") or []:
        coverage = f.get("coverage")
        verdict = badge("exceeds", "critical") if f.get("exceeds") else badge("fits", "finished")
        rows.append([f.get("limit"), verdict, f.get("window_tokens"), f.get("limit_tokens"), f.get("shortfall_tokens"),
                     f"{coverage:.1%}" if isinstance(coverage, (int, float)) else "",
                     f.get("message") or f.get("detail")])
    return section("Capacity findings", table(["Limit", "Verdict", "Window tokens", "Limit tokens", "Shortfall",
                                                 "Coverage", "Finding"], rows, "No capacity findings.",
                                                numeric=(2, 3, 4, 5)))


def _workers(state: dict) -> str:
    rows = []
    for w in state.get("workers") or []:
        pool = w.get("pool") if isinstance(w.get("pool"), dict) else {}
        pages = f"{pool.get('used_pages', '?')} / {pool.get('pages', '?')}" if pool else ""
        rows.append([w.get("name"), w.get("role"), w.get("state"), esc(str(w.get("pid") or "")), w.get("device"), pages,
                     w.get("restarts"), w.get("reason")])
    return section("Workers", table(["Name", "Role", "State", "PID", "Device", "Pages used / total",
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
        placeholder = is_placeholder(r)
        if phase(r) in FAILED_PHASES or placeholder:
            err = r.get("error") if isinstance(r.get("error"), dict) else {}
            end = next((e for e in reversed(r.get("events") or []) if e.get("event") in FAILED_PHASES), {})
            if placeholder and not err and not end:
                end = {**rejection_of(r), "message": "served from a placeholder: " + str(rejection_of(r)["message"])}
            failed.append([code(r.get("request_id")),
                           Html(f"{badge(phase(r))} {badge('placeholder')}") if placeholder else badge(phase(r)),
                           r.get("tenant"), r.get("decode_worker"), err.get("code") or end.get("code"),
                           err.get("message") or end.get("message"), time_cell(end.get("time"))])
    counters = state.get("counters") or {}
    body = (f"<p>{len(requests):,} request(s) in the window.</p>"
            '<div class="grid"><div><h3>By phase</h3>'
            + table(["Phase", "Requests"], [[p, n] for p, n in sorted(phases.items())], numeric=(1,))
            + "</div><div><h3>Engine counters</h3>"
            + table(["Counter", "Value"], [[k, v] for k, v in sorted(counters.items())], numeric=(1,))
            + "</div></div><h3>By tenant</h3>"
            + table(["Tenant", "Total", *cols], tenant_rows, numeric=tuple(range(1, len(cols) + 2)))
            + "<h3>Failed, rejected and served from a placeholder</h3>"
            + table(["Request", "Phase", "Tenant", "Decode worker", "Code", "Message", "When"], failed,
                    "No request failed or was rejected, and none was served from a placeholder.",
                    what="requests"))
    return section("Requests", body)


def _prompt_log(state: dict) -> str:
    entries = state.get("prompt_log") or []
    rows = [[time_cell(p.get("time")), code(p.get("request_id")), p.get("tenant"), p.get("model"), p.get("prompt_len"),
             code(p.get("prompt_hash")), p.get("data_tier")] for p in entries]
    note = ""
    if len(entries) >= PROMPT_LOG_CAP:  # the engine answers with the newest entries only, uncounted
        note = (f'<p class="more">The engine sends at most the newest {PROMPT_LOG_CAP:,} entries of a window: '
                "older prompts of this window may be left out, and how many is not known.</p>")
    return section("Prompt log (length and hash only)",
                   note + table(["Time", "Request", "Tenant", "Model", "Prompt tokens", "Prompt hash", "Data tier"],
                                rows, "No prompts in this window.", numeric=(4,), what="prompts"))


def _config(manifest: dict, state: dict) -> str:
    config = manifest.get("config") or {}
    text = json.dumps(config, indent=2, sort_keys=True, default=str)
    engine = json.dumps(state.get("engine") or {}, indent=2, sort_keys=True, default=str)
    return section("Engine configuration", f'<div class="grid"><div><h3>Configuration</h3><pre>{esc(text)}</pre>'
                    f"</div><div><h3>Engine status</h3><pre>{esc(engine)}</pre></div></div>")


def _files(manifest: dict) -> str:
    rows = [[f.get("name"), f.get("bytes"), code(f.get("sha256"))] for f in manifest.get("files") or []]
    return section("Files in this bundle (SHA-256)", table(["File", "Bytes", "SHA-256"], rows,
                                                             "No files listed.", numeric=(1,)))


def render_report(manifest: dict, state: dict, images: dict[str, bytes]) -> str:
    """The whole report.html: `images` maps PNG file names (pagemap-<pool>.png and
    pagemap-first-crossing-<pool>.png) to bytes."""
    title = f"PageWarden incident snapshot \u2013 {manifest.get('created_utc', '')}"
    parts = [_summary(state), report_incident.what_happened(state, manifest), _privacy(manifest),
             report_incident.rejected(state), report_incident.pairs(state), report_incident.alerts(state),
             _page_maps(manifest, state, images), _timeline(state), _capacity(state), _workers(state),
             _requests(state), _prompt_log(state), _config(manifest, state), _files(manifest)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{esc(title)}</title>"
            f"<style>{CSS}</style></head><body>{_header(manifest, state)}<main>{''.join(parts)}</main></body></html>\n")
