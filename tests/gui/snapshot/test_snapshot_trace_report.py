"""Incident snapshot: the JSON Schemas and `validate`, the Chrome trace, the HTML report and
the PNG renderer's plumbing, on a synthetic but realistic state (docs/SNAPSHOT.md).
Offline and fast; the one test that needs Chromium skips without it."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import zipfile
from html import escape
from html.parser import HTMLParser

import pytest
from jsonschema import Draft202012Validator
from PIL import Image

from gui.snapshot import render_png
from gui.snapshot.report import PRIVACY, render_report, utc
from gui.snapshot.schema import SCHEMAS, validate, validate_events
from gui.snapshot.trace import chrome_trace

T0 = 1796246000.0
EVIL = "<script>alert('x')</script>r3"


def _lifecycle(rid: str, start: float, *, end: str | None = "finished", extra=()) -> list[dict]:
    events = [
        {"event": "admitted", "time": start, "slot": 1, "prompt_len": 40, "prompt_hash": "ab" * 8, "tenant": "acme"},
        {"event": "reserve_sent", "time": start + 0.01, "worker": "decode-0"},
        {"event": "reserved", "time": start + 0.02, "worker": "decode-0", "epoch": 3},
        {"event": "prefill_sent", "time": start + 0.03, "worker": "prefill-0"},
        {"event": "prefilled", "time": start + 0.10, "worker": "prefill-0"},
        {"event": "transfer_done", "time": start + 0.12, "worker": "decode-0", "ok": True, "error": None},
        *extra,
    ]
    if end == "finished":
        events.append({"event": "finished", "time": start + 0.50, "reason": "length", "error": None, "tokens": 20})
    elif end == "failed":
        events.append({"event": "failed", "time": start + 0.30, "reason": "ownership_violation", "tokens": 3,
                       "error": {"code": "ownership_violation", "message": "pages not owned"}})
    return events


def _request(rid: str, start: float, phase: str, tenant: str = "acme", **fields) -> dict:
    return {"request_id": rid, "slot": 1, "tenant": tenant, "phase": phase, "prompt_len": 40,
            "prompt_hash": "ab" * 8, "max_new_tokens": 20, "tokens": 20, "decode_worker": "decode-0",
            "prefill_worker": "prefill-0", "pages": {"decode": 3}, "ttft_s": 0.12, "finish_reason": "length",
            "error": None, "arrival": start, **fields}


def make_state() -> dict:
    violation = [{"event": "ownership_violation", "time": T0 + 3.25, "worker": "decode-0",
                  "pages": [{"page": 17, "writer": [2, 3]}], "prevented": True},
                 {"event": "alert:ownership_violation", "time": T0 + 3.25, "prevented": True,
                  "detail": "met a page", "role": "subject"}]
    requests = [
        {**_request("r1", T0 + 1.0, "finished"), "events": _lifecycle("r1", T0 + 1.0)},
        {**_request("r2", T0 + 2.0, "finished", tenant="globex"), "events": _lifecycle("r2", T0 + 2.0)},
        {**_request(EVIL, T0 + 3.0, "failed", tokens=3, finish_reason="ownership_violation",
                    error={"code": "ownership_violation", "message": "pages not owned <b>by it</b>"}),
         "events": _lifecycle(EVIL, T0 + 3.0, end="failed", extra=violation)},
        # as the engine's history op sends a rejection: no record left, the phase is its last event
        {"request_id": "r4", "phase": "alert:admission_rejected", "arrival": T0 + 4.0,
         "events": [{"event": "rejected", "time": T0 + 4.0, "code": "context_too_long", "message": "too long"},
                    {"event": "alert:admission_rejected", "time": T0 + 4.0, "detail": "r4: context too long"}]},
        {**_request("r5", T0 + 5.0, "decoding", tokens=7, finish_reason=None, ttft_s=0.1),
         "events": _lifecycle("r5", T0 + 5.0, end=None)},
    ]
    alerts = [
        {"id": "ownership_violation:decode", "kind": "ownership_violation", "subject": "decode",
         "severity": "critical", "state": "firing", "detail": f"request {EVIL} met 1 page(s) it does not own",
         "first_seen": T0 + 3.25, "last_seen": T0 + 3.25, "count": 1, "acked": True,
         "requests": [EVIL, "r2"], "pages": [17], "prevented": True,
         "transitions": [["firing", T0 + 3.25], ["acknowledged", T0 + 6.0]]},
        {"id": "admission_rejected:acme", "kind": "admission_rejected", "subject": "acme", "severity": "warning",
         "state": "resolved", "detail": "r4: context too long", "first_seen": T0 + 4.0, "last_seen": T0 + 4.0,
         "count": 1, "acked": False, "requests": ["r4"], "pages": [],
         "transitions": [["pending", T0 + 3.9], ["firing", T0 + 4.0], ["resolved", T0 + 8.0]]},
    ]
    return {
        "schema": "pagewarden.snapshot.state/1",
        "window": {"since": T0, "until": T0 + 10.0},
        "engine": {"version": "0.1.0", "hostname": "gpu-box", "model": "/models/tiny", "uptime_s": 3600.0,
                   "allow_faults": True, "architecture": "LlamaForCausalLM"},
        "workers": [
            {"name": "decode-0", "role": "decode", "state": "ready", "pid": 124, "device": "cuda:0",
             "pool": {"name": "decode", "pages": 4096, "page_size": 16, "used_pages": 12, "free_pages": 4084},
             "restarts": 0, "reason": None},
            {"name": "prefill-0", "role": "prefill", "state": "ready", "pid": 123, "device": "cuda:0",
             "pool": {"name": "prefill", "pages": 2048, "page_size": 16, "used_pages": 0, "free_pages": 2048},
             "restarts": 0, "reason": None},
        ],
        "requests": requests,
        "alerts": alerts,
        "capacity": [
            {"limit": "pool:prefill", "exceeds": True, "window_tokens": 1048576, "limit_tokens": 681280,
             "detail": "42,580 pages x 16 tokens", "shortfall_tokens": 367296, "coverage": 0.649719,
             "message": "context window exceeds the prefill pool"},
            {"limit": "pool:decode", "exceeds": False, "window_tokens": 1048576, "limit_tokens": 2097152,
             "detail": "131,072 pages x 16 tokens", "shortfall_tokens": 0, "coverage": 2.0, "message": "fits"},
        ],
        "scope": {"pairs": [
            {"source": "r2", "source_slot": 2, "reader": EVIL, "reader_slot": 3,
             "pages": [["decode", 17], ["decode", 18]], "first": T0 + 3.2, "last": T0 + 3.26, "reads": 4},
            {"source": None, "source_slot": 9, "reader": EVIL, "reader_slot": 3,
             "pages": [["decode", 40]], "first": T0 + 3.21, "last": T0 + 3.3, "reads": 1},
        ], "reads": 5},
        "prompt_log": [{"request_id": r["request_id"], "time": r["arrival"], "tenant": r.get("tenant", "acme"),
                        "model": "tiny", "prompt_len": 40, "prompt_hash": "ab" * 8, "data_tier": None}
                       for r in requests if r["request_id"] != "r4"],
        "counters": {"admitted": 4, "finished": 2, "failed": 1, "rejected": 1, "cross_reads": 5},
        "engine_events": [{"subject": "worker:decode-0",
                           "events": [{"event": "started", "time": T0 + 0.2, "pid": 124, "reason": None}]}],
    }


def _png(colour: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 4), colour).save(out, format="PNG")
    return out.getvalue()


IMAGES = {"pagemap-decode.png": _png("red"), "pagemap-prefill.png": _png("blue")}


def make_manifest() -> dict:
    files = [{"name": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
             for name, data in [*IMAGES.items(), ("state.json", b"{}"), ("trace.json", b"[]")]]
    return {
        "schema": "pagewarden.snapshot/1", "app_version": "0.1.0", "engine_version": "0.1.0",
        "model": "/models/tiny", "architecture": "LlamaForCausalLM",
        "hostnames": {"exporter": "laptop", "engine": "gpu-box"}, "endpoint": "tcp://127.0.0.1:5650",
        "created_utc": "2026-12-02T19:30:00Z", "created_unix": T0 + 10.0, "engine_monotonic": 12345.6,
        "engine_uptime_s": 3600.0, "window": {"since": T0, "until": T0 + 10.0},
        "config": {"engine": {"max_context": 1048576, "strict_capacity": False}, "pools": {"decode": {"pages": 4096}}},
        "privacy": PRIVACY, "files": files,
    }


EVENT_LINES = [{"topic": "metrics", "seq": 1, "time": T0 + 1.0, "ttft_p50": 0.1},
               {"topic": "pages/decode", "seq": 7, "time": T0 + 1.5, "bulk": {"owner": 4096, "epoch": 4096}}]

# ---- schema ------------------------------------------------------------------------------


def test_the_schemas_are_valid_draft_2020_12_schemas():
    assert set(SCHEMAS) == {"manifest.json", "state.json", "events.jsonl"}
    for schema in SCHEMAS.values():
        Draft202012Validator.check_schema(schema)


def test_the_synthetic_bundle_validates():
    assert validate("manifest.json", make_manifest()) == []
    assert validate("state.json", make_state()) == []
    for line in EVENT_LINES:
        assert validate("events.jsonl", line) == []


STATE_KEYS = ["schema", "window", "engine", "workers", "requests", "alerts", "capacity", "scope", "prompt_log",
              "counters", "engine_events"]
MANIFEST_KEYS = ["schema", "app_version", "engine_version", "model", "architecture", "hostnames", "endpoint",
                 "created_utc", "created_unix", "engine_monotonic", "engine_uptime_s", "window", "config",
                 "privacy", "files"]


@pytest.mark.parametrize(("name", "key"), [*[("state.json", k) for k in STATE_KEYS],
                                           *[("manifest.json", k) for k in MANIFEST_KEYS]])
def test_every_required_top_level_key_is_checked(name, key):
    document = make_state() if name == "state.json" else make_manifest()
    del document[key]
    assert validate(name, document) == [f"{name}: $: '{key}' is a required property"]


@pytest.mark.parametrize(("name", "key", "value"), [
    ("state.json", "requests", {}), ("state.json", "counters", []), ("state.json", "engine", "up"),
    ("manifest.json", "created_unix", "now"), ("manifest.json", "config", None), ("manifest.json", "files", {}),
])
def test_every_top_level_value_has_its_type_checked(name, key, value):
    document = make_state() if name == "state.json" else make_manifest()
    document[key] = value
    problems = validate(name, document)
    assert len(problems) == 1 and problems[0].startswith(f"{name}: $.{key}: "), problems


def test_a_missing_nested_key_names_its_path():
    state, manifest = make_state(), make_manifest()
    del state["scope"]["pairs"][1]["reader"]
    del manifest["files"][2]["sha256"]
    assert validate("state.json", state) == ["state.json: $.scope.pairs[1]: 'reader' is a required property"]
    assert validate("manifest.json", manifest) == ["manifest.json: $.files[2]: 'sha256' is a required property"]


def test_a_wrong_type_names_its_path():
    state = make_state()
    state["requests"][1]["events"][2]["time"] = "soon"
    state["alerts"][0]["severity"] = "catastrophic"
    state["counters"]["admitted"] = 4.5
    problems = validate("state.json", state)
    assert len(problems) == 3, problems
    assert any(p.startswith("state.json: $.requests[1].events[2].time: 'soon' is not of type 'number'")
               for p in problems), problems
    assert any(p.startswith("state.json: $.alerts[0].severity:") for p in problems), problems
    assert any(p.startswith("state.json: $.counters.admitted:") for p in problems), problems
    manifest = make_manifest()
    manifest["files"][0]["sha256"] = "not-a-hash"
    manifest["schema"] = "pagewarden.snapshot/2"
    problems = validate("manifest.json", manifest)
    assert [p.split(":")[1].strip() for p in problems] == ["$.files[0].sha256", "$.schema"], problems


def test_nested_records_may_carry_extra_fields_but_not_wrong_types():
    state = make_state()
    state["requests"][0]["placeholder"] = True
    state["requests"][0]["events"][0]["model"] = "tiny"
    state["workers"][0]["stats"] = {"used_pages": 3}
    assert validate("state.json", state) == []
    state["requests"][0]["error"] = {"message": "a worker's error may lack a code"}
    assert validate("state.json", state) == []
    state["requests"][0]["error"] = {"code": 5}
    assert validate("state.json", state) == ["state.json: $.requests[0].error.code: 5 is not of type 'string'"]


def test_event_lines_and_events_jsonl():
    assert validate("events.jsonl", {"time": T0}) == ["events.jsonl: $: 'topic' is a required property"]
    assert validate("events.jsonl", {"topic": "pages/decode", "time": T0, "bulk": {"owner": "4096"}}) == [
        "events.jsonl: $.bulk.owner: '4096' is not of type 'integer'"]
    text = "\n".join([json.dumps(EVENT_LINES[0]), "{not json", json.dumps({"topic": 3, "time": T0}), ""])
    problems = validate_events(text.splitlines())
    assert len(problems) == 2 and problems[0].startswith("events.jsonl: line 2: not JSON"), problems
    assert problems[1] == "line 3: events.jsonl: $.topic: 3 is not of type 'string'"


def test_validate_refuses_an_unknown_file():
    with pytest.raises(ValueError, match="pages.npz"):
        validate("pages.npz", {})


# ---- trace -------------------------------------------------------------------------------


def _tracks(trace: dict) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def test_trace_events_are_well_formed_and_sorted():
    trace = chrome_trace(make_state())
    assert trace["displayTimeUnit"] == "ms"
    events = trace["traceEvents"]
    assert {e["ph"] for e in events} <= {"X", "i", "M"}
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {"PageWarden engine"}
    assert len({e["pid"] for e in events}) == 1
    tracks = _tracks(trace)
    assert sorted(tracks.values()) == ["alerts", "decode-0", "prefill-0", "supervisor"]
    timed = [e for e in events if e["ph"] != "M"]
    assert timed and all(e["ts"] >= 0 and e.get("dur", 0) >= 0 for e in timed)
    assert all(e["tid"] in tracks for e in timed)
    assert [e["ts"] for e in timed] == sorted(e["ts"] for e in timed)
    assert json.loads(json.dumps(trace)) == trace


def test_each_request_gets_the_spans_it_has_endpoints_for_on_the_right_tracks():
    trace = chrome_trace(make_state())
    tracks = _tracks(trace)
    spans: dict[str, list[tuple[str, str]]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            spans.setdefault(e["args"]["request_id"], []).append((e["name"], tracks[e["tid"]]))
    full = [("queue", "supervisor"), ("prefill", "prefill-0"), ("transfer", "decode-0"), ("decode", "decode-0")]
    assert spans == {"r1": full, "r2": full, EVIL: full, "r5": full[:3]}
    r1 = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["args"]["request_id"] == "r1"]
    assert r1[0]["ts"] == pytest.approx(1.0e6, abs=1) and r1[0]["dur"] == pytest.approx(0.01e6, abs=1)
    assert r1[3]["dur"] == pytest.approx(0.38e6, abs=1)  # transfer_done -> finished (microseconds)
    assert r1[3]["args"] == {"request_id": "r1", "tenant": "acme", "prompt_len": 40, "tokens": 20,
                             "finish_reason": "length"}
    failed = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["args"]["request_id"] == EVIL]
    assert failed[-1]["args"]["error"] == "ownership_violation"


def test_rejections_and_alert_transitions_are_instants():
    trace = chrome_trace(make_state())
    tracks = _tracks(trace)
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    rejected = [e for e in instants if e["name"] == "rejected"]
    assert [(tracks[e["tid"]], e["args"]["request_id"], e["args"]["code"]) for e in rejected] == [
        ("supervisor", "r4", "context_too_long")]
    alerts = [e for e in instants if tracks[e["tid"]] == "alerts"]
    assert [e["name"] for e in alerts] == ["ownership_violation firing", "admission_rejected pending",
                                           "admission_rejected firing", "ownership_violation acknowledged",
                                           "admission_rejected resolved"]
    assert all(e["s"] == "g" for e in alerts)
    assert alerts[0]["args"] == {"subject": "decode", "severity": "critical",
                                 "detail": make_state()["alerts"][0]["detail"], "requests": [EVIL, "r2"]}
    violation = [e for e in instants if e["name"] == "ownership_violation"]
    assert [tracks[e["tid"]] for e in violation] == ["decode-0"]


def test_missing_endpoints_and_times_before_the_window():
    state = make_state()
    r1 = state["requests"][0]
    r1["events"] = [e for e in r1["events"] if e["event"] != "prefilled"]
    state["window"]["since"] = T0 + 1.005  # after r1 was admitted, before it was reserved
    trace = chrome_trace(state)
    r1_spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["args"]["request_id"] == "r1"]
    assert [e["name"] for e in r1_spans] == ["queue", "decode"]
    assert r1_spans[0]["ts"] == 0 and r1_spans[0]["dur"] == pytest.approx(0.005e6, abs=1)
    state["window"]["since"] = T0 + 1.2  # r1's queue span ended before the window: dropped
    names = [e["name"] for e in chrome_trace(state)["traceEvents"]
             if e["ph"] == "X" and e["args"]["request_id"] == "r1"]
    assert names == ["decode"]


def test_a_worker_only_named_by_events_still_gets_a_track():
    state = make_state()
    state["workers"] = []
    assert sorted(_tracks(chrome_trace(state)).values()) == ["alerts", "decode-0", "prefill-0", "supervisor"]


# ---- report ------------------------------------------------------------------------------


class _Balance(HTMLParser):
    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.tags = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(tag)


def _report(state=None, images=None) -> str:
    return render_report(make_manifest(), make_state() if state is None else state,
                         IMAGES if images is None else images)


def test_the_report_is_well_formed_and_self_contained():
    html = _report()
    assert html.startswith("<!DOCTYPE html>")
    parser = _Balance()
    parser.feed(html)
    parser.close()
    assert parser.errors == [] and parser.stack == []
    assert "<script" not in html.lower() and "javascript:" not in html.lower()
    assert not re.search(r"\son[a-z]+\s*=", html)  # no event handler attributes
    for tag, attrs in parser.tags:
        for name in ("src", "href"):
            assert attrs.get(name) is None or attrs[name].startswith(("data:", "#")), (tag, attrs)  # in-page only
    for heading in ("Summary", "Privacy", "Affected pairs", "Alerts", "Timeline", "Page maps",
                    "Capacity findings", "Workers", "Requests", "Engine configuration", "Files in this bundle"):
        assert f"<h2>{heading}" in html, heading


def test_the_headline_counts_distinct_readers():
    state = make_state()
    assert f"1 response affected between {utc(T0 + 3.2)} and {utc(T0 + 3.3)}" in _report(state)
    assert utc(T0 + 3.2) == "2026-12-02T21:13:23.200Z"
    state["scope"]["pairs"].append({"source": "r1", "source_slot": 1, "reader": "r5", "reader_slot": 5,
                                    "pages": [["decode", 3]], "first": T0 + 5.5, "last": T0 + 5.6, "reads": 1})
    assert f"2 responses affected between {utc(T0 + 3.2)} and {utc(T0 + 5.6)}" in _report(state)
    state["scope"]["pairs"] = []
    html = _report(state)
    assert f"No cross-request reads were recorded between {utc(T0)} and {utc(T0 + 10.0)}" in html
    assert "affected between" not in html


def test_the_report_never_says_nothing_crossed_beside_an_alert_that_says_it_did():
    """Issue 15: a one-second window missed the incident's reads and the report said "no
    request received another request's data" next to a NOT-prevented ownership_violation."""
    state = make_state()
    state["scope"]["pairs"] = []
    assert escape("No request read another request's data") in _report(state)  # this alert: prevented
    state["alerts"][0]["prevented"] = False
    html = _report(state)
    assert "No request read another request" not in html and "No cross-request reads were recorded" not in html
    assert "1 isolation alert(s) say data crossed (not shown prevented)" in html
    state["scope"].update(incomplete_before=T0 + 1.0, dropped_reads=1234)
    assert "Incomplete: 1,234 reads up to" in _report(state)


def test_empty_or_partial_documents_still_render():
    html = render_report({}, {"scope": {"pairs": [{"reader": "r9"}]}}, {})
    assert "1 response affected between" in html and "</html>" in html
    assert "No cross-request reads were recorded" in render_report({}, {}, {})
    trace = chrome_trace({})
    assert [e for e in trace["traceEvents"] if e["ph"] != "M"] == []
    assert sorted(_tracks(trace).values()) == ["alerts", "supervisor"]


def test_network_strings_are_escaped_not_dropped():
    html = _report()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;r3" in html
    assert "pages not owned &lt;b&gt;by it&lt;/b&gt;" in html
    assert "<b>by it</b>" not in html


def test_images_hashes_and_privacy_are_in_the_report():
    html = _report()
    for name, data in IMAGES.items():
        assert f'<img src="data:image/png;base64,{base64.b64encode(data).decode()}" alt="{name}">' in html
    for entry in make_manifest()["files"]:
        assert entry["sha256"] in html
    assert PRIVACY in html
    assert "Bundle-specific wording." in render_report({**make_manifest(), "privacy": "Bundle-specific wording."},
                                                         make_state(), {})
    assert PRIVACY in render_report({}, make_state(), {})
    assert "<h2>Page maps" not in _report(images={})


def test_the_report_lists_failures_capacity_workers_and_config():
    html = _report()
    failed = html[html.index("<h3>Failed, rejected and served from a placeholder"):]
    failed = failed[:failed.index("</table>")]
    assert "ownership_violation" in failed and "context_too_long" in failed and ">r4<" in failed
    assert ">r1<" not in failed
    by_phase = html[html.index("<h3>By phase"):html.index("<h3>Engine counters")]
    assert ">rejected<" in by_phase and "alert:admission_rejected" not in by_phase
    assert "pool:prefill" in html and "1,048,576" in html and "65.0%" in html
    assert "prefill-0" in html and "12 / 4096" in html and ">124<" in html  # a pid, not 124 with commas
    assert "&quot;strict_capacity&quot;: false" in html
    timeline = html[html.index("<h2>Timeline"):html.index("<h2>Capacity findings")]
    assert timeline.index("admission_rejected") < timeline.index("acknowledged") < timeline.index("resolved")
    assert 'class="lane"' in timeline and "started" in timeline
    lanes = {m[0]: m[1].count('class="span"') for m in
             re.findall(r'<div class="id mono">(.*?)</div><div class="track">(.*?)</div></div>', timeline)}
    assert lanes == {"r1": 4, "r2": 4, escape(EVIL): 4, "r5": 4}  # r5: still decoding at the window's end


# ---- render_png (no browser needed) ------------------------------------------------------


def test_a_missing_browser_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(render_png.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="chromium, chromium-browser, google-chrome"):
        render_png.find_browser()


def test_trim_cuts_the_empty_band_below_the_page(tmp_path):
    path = tmp_path / "shot.png"
    image = Image.new("RGB", (50, 400), "#f4f5f7")
    image.paste(Image.new("RGB", (50, 100), "#1f2226"), (0, 0))
    image.save(path)
    assert render_png._trim_bottom(path, margin=10)
    with Image.open(path) as trimmed:
        assert trimmed.size == (50, 110)
    image.paste(Image.new("RGB", (50, 395), "#1f2226"), (0, 0))
    image.save(path)  # content down to the bottom edge: the page may go on below
    assert not render_png._trim_bottom(path, margin=10)


def test_the_command_line_needs_a_bundle_with_a_report(tmp_path, capsys):
    assert render_png.main([]) == 2
    bundle = tmp_path / "b.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr("manifest.json", "{}")
    assert render_png.main([str(bundle), str(tmp_path / "out.png")]) == 1
    assert "has no report.html" in capsys.readouterr().err


def test_chromium_renders_the_report(tmp_path):
    try:
        render_png.find_browser()
    except RuntimeError:
        pytest.skip("no Chromium on this machine")
    bundle = tmp_path / "bundle.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr("report.html", _report())
    out = tmp_path / "report.png"
    assert render_png.main([str(bundle), str(out)]) == 0
    with Image.open(out) as image:
        assert image.width == 1280 and 1000 < image.height < 6000
        assert image.getpixel((10, 10))[:3] == (0x1F, 0x22, 0x26)  # the header band
