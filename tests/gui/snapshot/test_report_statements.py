"""The report never understates, on synthetic states: every alert episode, the rejected and
placeholder requests, tenants, page ranges, the runbook chosen by what happened, "+N more"
wherever a list is cut, and the page maps at the first crossing (or why there are none).
Offline and fast; tests/gui/snapshot/test_report_against_truth.py checks the same statements
against a real engine's ground truth."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gui.snapshot import first_crossing, report_html, report_incident
from gui.snapshot.bundle import read_bundle, write_bundle
from gui.snapshot.collect import collect
from gui.snapshot.incident_facts import NOT_PREVENTED, NOTHING_CROSSED, PREVENTED, outcome, page_runs
from gui.snapshot.report import render_report
from gui.snapshot.schema import validate
from tests.gui.snapshot.report_reading import section
from tests.gui.snapshot.test_snapshot_bundle import make_snapshot

T0 = 1_796_246_000.0
ON = {"admission": True, "manifest_check": True, "writer_tag_check": True, "deferred_release": True, "scrub": True}
NO_FAULTS = {"placeholder_on_reject": False, "skip_scrub": False, "early_release": False, "short_transfer": False,
             "stale_block_table": False}


def manifest(defences=None, faults=None) -> dict:
    return {"created_utc": "2026-12-02T21:14:00.000Z",
            "config": {"engine": {"ownership_policy": "abort"}, "defences": {**ON, **(defences or {})},
                       "faults": {**NO_FAULTS, **(faults or {})}}}


def request(rid: str, tenant: str, phase: str, *, placeholder=False, rejected=False, t=T0) -> dict:
    events = []
    if placeholder:
        events.append({"event": "placeholder", "time": t, "message": f"request {rid} exceeds the prefill pool"})
    if rejected:
        events.append({"event": "rejected", "time": t, "code": "admission_rejected", "message": "too long"})
    else:
        events.append({"event": "admitted", "time": t + 0.001, "tenant": tenant})
        events.append({"event": phase if phase in ("finished", "failed") else "reserved", "time": t + 0.5})
    return {"request_id": rid, "slot": int(rid[1:]), "tenant": None if rejected else tenant, "phase": phase,
            "tokens": 0 if rejected else 8, "arrival": t, "events": events,
            "error": {"code": "ownership_violation", "message": "aborted"} if phase == "failed" else None}


def alert(kind: str, subject: str, *, episode=None, prevented=None, requests=(), pages=(), first=T0 + 3, **extra):
    record = {"id": f"{kind}:{subject}", "kind": kind, "subject": subject, "severity": "critical",
              "state": "resolved", "detail": f"{kind} detail", "first_seen": first, "last_seen": first + 5,
              "count": 7, "acked": False, "requests": list(requests), "pages": list(pages),
              "transitions": [["firing", first], ["resolved", first + 65]], **extra}
    if episode is not None:
        record.update(episode=episode, key=f"{record['id']}#{episode}")
    if prevented is not None:
        record["prevented"] = prevented
    return record


def incident_state() -> dict:
    """Two placeholders (one read acme's and globex's pages, one was aborted), one outright
    rejection, an ownership_violation in two episodes (the first prevented, the second not)."""
    requests = [request("r1", "acme", "finished"), request("r2", "globex", "finished"),
                request("r3", "over-long", "finished", placeholder=True, t=T0 + 2),
                request("r4", "over-long", "failed", placeholder=True, t=T0 + 1),
                request("r5", "initech", "rejected", rejected=True, t=T0 + 2.5)]
    pages = [["decode-0", p] for p in (*range(12, 20), 33)]
    return {
        "schema": "pagewarden.snapshot.state/1", "window": {"since": T0, "until": T0 + 100},
        "engine": {}, "workers": [], "requests": requests, "capacity": [], "prompt_log": [], "counters": {},
        "engine_events": [],
        "alerts": [
            alert("ownership_violation", "decode-0", episode=1, prevented=True, requests=["r4"], pages=[40, 41],
                  first=T0 + 1, requests_total=1, pages_total=2),
            alert("ownership_violation", "decode-0", episode=2, prevented=False, requests=["r3", "r1", "r2"],
                  pages=list(range(12, 20)) + [33], first=T0 + 2, requests_total=3, pages_total=9),
            alert("admission_rejected", "pool:prefill", episode=1, prevented=False, requests=["r4", "r3"],
                  requests_total=2, pages_total=0),
        ],
        # no tenants on the pairs: an older engine; the report takes them from the requests
        "scope": {"pairs": [
            {"source": "r1", "source_slot": 1, "reader": "r3", "reader_slot": 3, "pages": pages[:8],
             "first": T0 + 2.1, "last": T0 + 2.4, "reads": 40},
            {"source": "r2", "source_slot": 2, "reader": "r3", "reader_slot": 3, "pages": pages[8:],
             "first": T0 + 2.2, "last": T0 + 2.3, "reads": 5}], "reads": 45},
    }


def report(state=None, man=None, images=None) -> str:
    return render_report(man or manifest({"writer_tag_check": False}, {"placeholder_on_reject": True}),
                         state or incident_state(), images or {})


# ---- rejected and placeholder requests ---------------------------------------------------


def test_placeholder_and_rejected_requests_are_listed_and_counted():
    html = report()
    s = section(html, "Rejected and placeholder requests")
    assert ("2 request(s) rejected by admission but served from a placeholder \u2014 the incident's path "
            "(1 of them received other requests' data); 1 rejected outright (no reply served); 1 failed.") in s.text
    placeholders = s.table("Rejected by admission but served from a placeholder (2)").records()
    assert [r["Request"] for r in placeholders] == ["r4", "r3"]  # earliest first
    assert placeholders[1]["Received other requests' data"] == "yes from r1, r2"
    assert placeholders[0]["Received other requests' data"] == "no failed: ownership_violation"
    assert [r["Request"] for r in s.table("Rejected, no reply served (1)").records()] == ["r5"]
    assert "No request failed or was rejected" not in html
    summary = section(html, "Summary").text
    assert "2 request(s) rejected by admission but served from a placeholder, 1 rejected, 1 failed" in summary
    failed = section(html, "Requests").table("Failed, rejected and served from a placeholder").column("Request")
    assert sorted(failed) == ["r3", "r4", "r5"]


def test_only_placeholders_never_read_as_nothing_rejected():
    state = incident_state()
    state["requests"] = [r for r in state["requests"] if r["request_id"] != "r5"]
    s = section(report(state), "Rejected and placeholder requests")
    assert "No other request was rejected (the placeholder requests above were rejected, then served)." in s.text
    assert "No request was rejected." not in s.text


def test_a_placeholder_the_engine_forgot_still_counts():
    state = incident_state()
    forgotten = state["requests"].pop(2)  # r3: its events come as an engine-event group
    state["engine_events"].append({"subject": "r3", "events": forgotten["events"]})
    s = section(report(state), "Rejected and placeholder requests")
    assert "2 request(s) rejected by admission but served from a placeholder" in s.text


# ---- tenants and page ranges ----------------------------------------------------------------


def test_pairs_name_tenants_from_the_requests_when_the_scope_lacks_them():
    s = section(report(), "Affected pairs")
    by_tenant = s.table("By tenant").records()
    assert [r["Who received whose data"] for r in by_tenant] == [
        "tenant over-long received tenant acme's data", "tenant over-long received tenant globex's data"]
    rows = s.table("By request").records()
    assert [(r["Reader"], r["Reader tenant"], r["Source"], r["Source tenant"]) for r in rows] == [
        ("r3", "over-long", "r1", "acme"), ("r3", "over-long", "r2", "globex")]
    state = incident_state()
    state["scope"]["pairs"][0].update(source_tenant="engine-says", reader_tenant="engine-too")
    first = section(report(state), "Affected pairs").table("By request").records()[0]
    assert (first["Reader tenant"], first["Source tenant"]) == ("engine-too", "engine-says")  # the engine's first


def test_pages_are_ranges_per_pool():
    assert page_runs([33, 12, 13, 14, 15, 16, 17, 18, 19, 12]) == [(12, 19), (33, 33)]
    state = incident_state()
    state["scope"]["pairs"][0]["pages"] = [["decode-0", p] for p in (*range(12, 20), 33)] + [["prefill-0", 4]]
    rows = section(report(state), "Affected pairs").table("By request").records()
    assert rows[0]["Pages"] == "decode-0: 12\u201319, 33; prefill-0: 4"


def test_many_page_ranges_say_how_many_pages_they_left_out(monkeypatch):
    monkeypatch.setattr(report_incident, "CELL_RANGES", 2)
    state = incident_state()
    state["scope"]["pairs"][0]["pages"] = [["decode-0", p] for p in (1, 2, 5, 7, 8, 9, 20)]
    rows = section(report(state), "Affected pairs").table("By request").records()
    assert rows[0]["Pages"] == "decode-0: 1\u20132, 5 +4 more pages (in state.json)"


# ---- alert episodes and cut lists ------------------------------------------------------------


def test_every_episode_is_a_row_of_its_own():
    rows = section(report(), "Alerts").table("").records()
    assert [(r["Alert and its detail"].split()[0], r["Episode"], r["Prevented"]) for r in rows] == [
        ("ownership_violation", "1 of 2", "yes"), ("ownership_violation", "2 of 2", "no"),
        ("admission_rejected", "1 of 1", "no")]
    state = incident_state()
    for a in state["alerts"]:  # an older engine: no episode numbers, the same id twice
        del a["episode"], a["key"]
    rows = section(report(state), "Alerts").table("").records()
    assert [r["Episode"] for r in rows] == ["1 of 2", "2 of 2", "1 of 1"]
    state["alerts"][0]["previous_run"] = True
    html = report(state)
    assert "1 of 2 previous run" in section(html, "Alerts").table("").column("Episode")
    assert "3 episode(s) of 2 alert(s), 1 from an earlier engine run" in section(html, "Alerts").text


def test_alert_lists_say_how_many_they_left_out(monkeypatch):
    monkeypatch.setattr(report_incident, "CELL_NAMES", 2)
    state = incident_state()
    named = [f"r{i}" for i in range(100, 150)]  # the newest 50 of 57 named
    state["alerts"][1].update(requests=named, requests_total=57, pages=list(range(100, 150)), pages_total=60)
    row = section(report(state), "Alerts").table("").records()[1]
    assert row["Requests"] == "r100, r101 +55 more requests (the engine keeps the newest 50 of 57)"
    assert row["Pages"] == "100\u2013149 +10 more pages (the engine keeps the newest 50 of 60)"
    del state["alerts"][1]["requests_total"]  # an engine that did not count: at least
    row = section(report(state), "Alerts").table("").records()[1]
    assert row["Requests"] == ("r100, r101 +48 more requests (at least: the engine keeps the newest 50 and did "
                               "not count the rest)")


def test_long_tables_say_how_many_rows_they_left_out(monkeypatch):
    monkeypatch.setattr(report_html, "MAX_ROWS", 1)
    html = report()
    assert "1 more pairs not shown here (of 2)" in section(html, "Affected pairs").text
    assert "2 more alert episodes not shown here (of 3)" in section(html, "Alerts").text
    assert "1 more placeholder requests not shown here (of 2)" in section(html, "Rejected and placeholder").text


# ---- the runbook, chosen by what happened ----------------------------------------------------


def test_not_prevented_names_responses_tenants_and_the_defences_that_were_off():
    html = report()
    assert outcome(incident_state(), manifest()).kind == NOT_PREVENTED
    s = section(html, "What happened")
    assert s.title == "What happened: NOT prevented"
    assert "Other requests' data reached 1 response: no defence stopped it." in s.text
    assert "The response of r3 carried data other requests wrote." in s.text
    assert "tenant over-long received tenant acme's data (1 request pair(s))" in s.text
    assert "Writer-tag check (I1): read and write only own pages (writer_tag_check)" in s.text
    assert "placeholder on reject" in s.text and "turn writer_tag_check back on" in s.text
    assert "were aborted" not in s.text and "Nobody needs notifying" not in s.text


def test_prevented_says_nobody_needs_notifying():
    state = incident_state()
    state["scope"]["pairs"] = []
    state["alerts"] = state["alerts"][:1]  # only the prevented episode
    state["requests"] = [r for r in state["requests"] if r["request_id"] in ("r1", "r2", "r4")]
    assert outcome(state, manifest()).kind == PREVENTED
    s = section(render_report(manifest({"manifest_check": False}), state, {}), "What happened")
    assert s.title == "What happened: prevented"
    assert "Nobody needs notifying" in s.text and "turn manifest_check back on" in s.text
    assert "leaked" not in s.text
    # a transfer accepted despite its manifest (its defence off), its request then aborted
    state["alerts"].append(alert("transfer_mismatch", "decode-0", episode=1, prevented=False, requests=["r4"]))
    html = render_report(manifest({"manifest_check": False}), state, {})
    assert section(html, "What happened").title == "What happened: prevented"
    assert "every request it names failed before an answer went out" in section(html, "What happened").text
    assert section(html, "Alerts").table("").column("Prevented") == ["yes", "no stopped later"]
    state["requests"].append(request("r6", "acme", "finished"))
    state["alerts"][-1]["requests"].append("r6")  # one it names answered: not shown prevented
    assert section(render_report(manifest(), state, {}), "What happened").title == "What happened: NOT prevented"


def test_an_alert_that_does_not_say_it_was_prevented_is_not_taken_as_prevented():
    state = incident_state()
    state["scope"]["pairs"] = []
    state["alerts"] = [alert("canary_marker_in_output", "r9", requests=["canary-1", "r9"])]
    s = section(render_report(manifest(), state, {}), "What happened")
    assert s.title == "What happened: NOT prevented"
    assert "some do not say either way: counted as not prevented" in s.text
    assert "Every defence was on: this is an engine bug" in s.text
    state["alerts"] = [alert("late_write_dropped", "decode-0")]  # the kind itself means it was stopped
    assert section(render_report(manifest(), state, {}), "What happened").title == "What happened: prevented"
    state["alerts"] = []
    assert outcome(state, manifest()).kind == NOTHING_CROSSED
    s = section(render_report(manifest(faults={"placeholder_on_reject": True}), state, {}), "What happened")
    assert s.title == "What happened: no isolation failure"
    assert "2 request(s) rejected by admission were served from a placeholder" in s.text


# ---- page maps at the first crossing ----------------------------------------------------------


def keyframe(pool: str, t: float, n: int = 64, reason: str = "first_crossing") -> dict:
    owner = [-1] * n
    writer = [-1] * n
    for page in range(12, 20):
        owner[page], writer[page] = 3, (1 << 32) | 5  # r3's pages, written by slot 1: crossed
    owner[20], writer[20] = 3, (3 << 32) | 1  # its own
    return {"time": t, "pool": pool, "reason": reason, "owner": owner, "epoch": [1] * n, "writer": writer,
            "filled": [16 if o >= 0 else 0 for o in owner], "state": [3 if o >= 0 else 0 for o in owner]}


class FakeEngine:
    """The read-only ops collect() asks, answered from a synthetic snapshot."""

    def __init__(self, keyframes):
        self.snap, self.keyframes_ = make_snapshot(), keyframes

    def status(self):
        s = self.snap.state
        return {"engine": {**s["engine"], "time": T0 + 10, "uptime_s": 10.0}, "workers": s["workers"],
                "alerts": [], "capacity": [], "counters": {}, "config": self.snap.manifest["config"]}

    def call(self, op, **kw):
        if op == "history":
            answer = {"requests": self.snap.state["requests"], "engine_events": [], "next": None, "until": T0 + 10}
            if self.keyframes_ is not None:
                answer["keyframes"] = self.keyframes_
            return answer
        if op == "scope":
            return {"pairs": [{"source": "r1", "source_slot": 1, "reader": "r3", "reader_slot": 3,
                               "pages": [["decode-0", 12]], "first": T0 + 2, "last": T0 + 3, "reads": 1}],
                    "reads": 1}
        return {"entries": []}

    def page_metadata(self, pool):
        return self.snap.pages[pool]


def test_first_crossing_maps_travel_beside_the_export_time_maps(tmp_path):
    frames = [keyframe("decode-0", T0 + 2.5), keyframe("decode-0", T0 + 2.0), keyframe("decode-0", T0 + 1, reason="x")]
    snap = collect(FakeEngine(frames))
    assert snap.state["first_crossing"]["maps"] == [{"pool": "decode-0", "time": T0 + 2.0, "reason": "first_crossing",
                                                    "pages": 64}]
    assert validate("state.json", json.loads(json.dumps(snap.state))) == []
    opened = read_bundle(write_bundle(snap, tmp_path / "s.zip"))
    assert opened.verified, opened.warnings
    names = {f["name"] for f in opened.manifest["files"]}
    assert {"pages-first-crossing.npz", "pagemap-first-crossing-decode-0.png", "pagemap-decode-0.png"} <= names
    frame = opened.first_crossing["decode-0"]
    assert frame["time"] == T0 + 2.0 and frame["arrays"]["owner"].dtype == np.int32
    assert np.flatnonzero(first_crossing.crossed_pages(frame["arrays"])).tolist() == list(range(12, 20))
    html = render_report(opened.manifest, opened.state, opened.images)
    maps = section(html, "Page maps").text
    assert "decode-0 at the first crossing, 2026-12-02T21:13:22.000Z" in maps
    assert "decode-0 at export time, " in maps and "not available" not in maps
    assert html.index("pagemap-first-crossing-decode-0.png") < html.index("(pagemap-decode-0.png)")


@pytest.mark.parametrize("keyframes, why", [
    (None, "the engine sent no page-map keyframes"),
    ([], "the engine kept no page-map keyframe of a first crossing in this window"),
    ([{"pool": "decode-0", "reason": "first_crossing", "time": T0, "owner": [1, 2]}],
     "the engine kept no page-map keyframe of a first crossing"),
])
def test_without_first_crossing_maps_the_report_says_why(tmp_path, keyframes, why):
    snap = collect(FakeEngine(keyframes))
    opened = read_bundle(write_bundle(snap, tmp_path / "s.zip"))
    assert opened.verified and "pages-first-crossing.npz" not in opened.images
    maps = section(render_report(opened.manifest, opened.state, opened.images), "Page maps").text
    assert f"The page maps at the first crossing are not available: {why}" in maps
    assert "these maps do not show the leak" in maps


def test_an_old_bundle_still_opens_and_says_it_has_no_first_crossing_maps(tmp_path):
    snap = make_snapshot()  # as collect() made them before: no first_crossing in state.json
    snap.state["scope"]["pairs"] = [{"source": "r1", "source_slot": 1, "reader": "r9", "reader_slot": 9,
                                     "pages": [["decode-0", 3]], "first": T0, "last": T0, "reads": 1}]
    opened = read_bundle(write_bundle(snap, tmp_path / "old.zip"))
    assert opened.verified, opened.warnings
    assert opened.first_crossing == {}
    maps = section(render_report(opened.manifest, opened.state, opened.images), "Page maps").text
    assert "this bundle was exported before snapshots kept the page maps at the first crossing" in maps
