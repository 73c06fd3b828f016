"""The incident on a real engine (supervisor and workers on loopback), exported twice, and every
statement of the report checked against the ground truth: the scenario's own (which requests
were over-long, each request's tenant) and the engine's (`ground_truth`: every cross read the
decode workers saw happen).

Wave 1 runs the incident with the writer-tag check on (every violation masked and aborted),
wave 2 with it off (placeholders read other requests' pages and answer). A bundle is exported
after each wave.
"""

from __future__ import annotations

import random
import time
import zipfile
from collections import defaultdict

import pytest

from engine.client.local_server import LocalServer, write_config
from engine.config import EngineConfig
from engine.guard.reproduce import run_workload
from engine.guard.scenarios import SCENARIOS, config_sections
from gui.snapshot import report_html, report_incident
from gui.snapshot.bundle import read_bundle, write_bundle
from gui.snapshot.collect import collect
from gui.snapshot.report import render_report
from tests.gui.snapshot.report_reading import section

pytestmark = pytest.mark.e2e
SCALE = 0.5


def _runs(pages: set[int]) -> list[tuple[int, int]]:
    """The ground truth's pages as runs of consecutive pages (written here again, not taken
    from the report's code)."""
    runs: list[list[int]] = []
    for page in sorted(pages):
        if runs and page == runs[-1][1] + 1:
            runs[-1][1] = page
        else:
            runs.append([page, page])
    return [(a, b) for a, b in runs]


def _ranges(runs: list[tuple[int, int]]) -> str:
    """As the report should print them: 12–19, 33."""
    return ", ".join(f"{a}" if a == b else f"{a}\u2013{b}" for a, b in runs)


@pytest.fixture(scope="module")
def incident(tmp_path_factory):
    """Both waves on one engine; the bundles, the ground truth and the scenario's truth."""
    root = tmp_path_factory.mktemp("incident")
    scenario = SCENARIOS["incident-placeholder"]
    sections = config_sections(scenario)
    sections["canaries"] = {"enabled": False}  # every request in the truth is then one the scenario sent
    config = write_config(root / "incident.toml", EngineConfig(), **sections)
    server = LocalServer(config, "--allow-faults")
    try:
        client = server.client(timeout_s=300)
        server.wait_workers(client)
        rng, tenants, over_long, waves = random.Random(7), {}, [], []
        for defences in ({"manifest_check": False}, {"manifest_check": False, "writer_tag_check": False}):
            client.reconfigure({"defences": defences}, apply=True)
            work = scenario.workload(rng, SCALE)
            ends = run_workload(client, work)
            for item, end in zip(work, ends):
                tenants[end["request_id"]] = item["tenant"]
                if item["tenant"] == "over-long":
                    over_long.append(end["request_id"])
            time.sleep(0.5)  # the last reads reach the supervisor's log
            truth = client.call("ground_truth")["reads"]
            path = write_bundle(collect(client, endpoint=server.control), root / f"wave{len(waves) + 1}.zip")
            waves.append({"bundle": read_bundle(path), "truth": truth, "over_long": list(over_long),
                          "defences": defences})
        client.close()
    finally:
        server.stop()
    assert not waves[0]["truth"], "wave 1 (writer-tag check on) let data cross"
    assert waves[1]["truth"], "the incident did not happen in wave 2"
    return {"waves": waves, "tenants": tenants}


def _report(wave) -> str:
    opened = wave["bundle"]
    assert opened.verified, opened.warnings
    return render_report(opened.manifest, opened.state, opened.images)


def _truth_pairs(wave) -> dict[tuple[str, str], dict[str, set[int]]]:
    pairs: dict[tuple[str, str], dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for read in wave["truth"]:
        pairs[(read["reader"], read["source"])][read["pool"]].add(read["page"])
    return pairs


def test_the_bundle_as_written_carries_the_statements(incident):
    wave = incident["waves"][1]
    with zipfile.ZipFile(wave["bundle"].path) as zf:
        html = zf.read("report.html").decode()
    files = "<h2>Files in this bundle"  # the written manifest lists report.html itself too
    assert html.split(files)[0] == _report(wave).split(files)[0]  # what follows reads the report a reviewer gets


def test_every_placeholder_request_is_listed_and_nothing_reads_as_not_rejected(incident):
    for wave in incident["waves"]:
        html = _report(wave)
        s = section(html, "Rejected and placeholder requests")
        expected = wave["over_long"]  # each over-long request exceeds the prefill pool: a placeholder
        listed = s.table("Rejected by admission but served from a placeholder").column("Request")
        assert sorted(listed) == sorted(expected)
        readers = {r["reader"] for r in wave["truth"]}
        leaked = len(readers & set(expected))
        assert (f"{len(expected)} request(s) rejected by admission but served from a placeholder \u2014 the "
                f"incident's path ({leaked} of them received other requests' data); 0 rejected outright") in s.text
        assert "No request failed or was rejected" not in html
        assert f"{len(expected)} request(s) rejected by admission but served from a placeholder" in \
            section(html, "Summary").text


def test_the_placeholders_that_read_other_requests_data_are_marked_with_their_sources(incident):
    wave = incident["waves"][1]
    sources = defaultdict(set)
    for read in wave["truth"]:
        sources[read["reader"]].add(read["source"])
    rows = section(_report(wave), "Rejected and placeholder requests").table(
        "Rejected by admission but served from a placeholder").records()
    for row in rows:
        rid = row["Request"]
        cell = row["Received other requests' data"]
        if rid in sources:
            named, _, rest = cell.removeprefix("yes from ").partition(" +")
            left = int(rest.split()[0]) if rest else 0
            assert cell.startswith("yes from ") and set(named.split(", ")) <= sources[rid], row
            assert len(named.split(", ")) + left == len(sources[rid]), row
        else:
            assert not cell.startswith("yes"), row


def test_affected_pairs_name_the_tenants_of_the_ground_truth(incident):
    wave, tenants = incident["waves"][1], incident["tenants"]
    s = section(_report(wave), "Affected pairs")
    rows = s.table("By request").records()
    assert {(r["Reader"], r["Reader tenant"], r["Source"], r["Source tenant"]) for r in rows} == {
        (reader, tenants[reader], source, tenants[source]) for reader, source in _truth_pairs(wave)}
    groups = defaultdict(set)
    for reader, source in _truth_pairs(wave):
        groups[(tenants[reader], tenants[source])].add((reader, source))
    by_tenant = {r["Who received whose data"]: r for r in s.table("By tenant").records()}
    assert set(by_tenant) == {f"tenant {r} received tenant {w}'s data" for r, w in groups}
    for (r, w), pairs in groups.items():
        assert by_tenant[f"tenant {r} received tenant {w}'s data"]["Request pairs"] == str(len(pairs))


def test_pages_are_the_ground_truths_pages_as_ranges(incident):
    wave = incident["waves"][1]
    truth = _truth_pairs(wave)
    rows = section(_report(wave), "Affected pairs").table("By request").records()
    for row in rows:
        pools = truth[(row["Reader"], row["Source"])]
        expected = "; ".join(f"{pool}: {_ranges(_runs(pages))}" for pool, pages in sorted(pools.items()))
        assert row["Pages"] == expected, row


def test_the_runbook_follows_what_happened(incident):
    prevented, leaked = incident["waves"]
    s = section(_report(prevented), "What happened")
    assert s.title == "What happened: prevented"  # the ground truth of wave 1 holds no read
    assert "Nobody needs notifying" in s.text and "Manifest check" in s.text and "Writer-tag check" not in s.text
    aborted = prevented["over_long"]  # the placeholders met other requests' pages; the writer-tag check aborted them
    assert f"{len(aborted)} request(s) met data not their own and were masked and failed" in s.text
    assert all(rid in s.text for rid in aborted)
    for row in section(_report(prevented), "Alerts").table("").records():  # wave 1's alerts
        kind = row["Alert and its detail"].split()[0]
        if kind == "transfer_mismatch":  # accepted (manifest check off); the writer-tag check aborted them
            assert row["Prevented"] == "no stopped later", row
        elif kind == "ownership_violation":
            assert row["Prevented"] == "yes", row
    s = section(_report(leaked), "What happened")
    readers = sorted({r["reader"] for r in leaked["truth"]})
    assert s.title == "What happened: NOT prevented"
    noun = "response" if len(readers) == 1 else "responses"
    assert f"Other requests' data reached {len(readers)} {noun}: no defence stopped it." in s.text
    for reader in readers:
        assert reader in s.text
    tenants = incident["tenants"]
    for reader, source in _truth_pairs(leaked):
        assert f"tenant {tenants[reader]} received tenant {tenants[source]}'s data" in s.text
    assert "Defences off: Manifest check" in s.text and "Writer-tag check (I1)" in s.text
    assert "placeholder on reject" in s.text
    assert "were aborted" not in s.text and "Nobody needs notifying" not in s.text


def test_every_alert_episode_is_in_the_report(incident):
    wave = incident["waves"][1]
    alerts = wave["bundle"].state["alerts"]
    rows = section(_report(wave), "Alerts").table("").records()
    assert len(rows) == len(alerts)
    assert sorted(r["Alert and its detail"].split()[0] for r in rows) == sorted(a["kind"] for a in alerts)
    violation = next(r for r in rows if r["Alert and its detail"].startswith("ownership_violation"))
    assert violation["Prevented"] == "no"  # wave 2's reads were not prevented


def test_every_cut_list_says_how_many_it_left_out(incident, monkeypatch):
    monkeypatch.setattr(report_incident, "CELL_NAMES", 2)
    monkeypatch.setattr(report_incident, "CELL_RANGES", 1)
    monkeypatch.setattr(report_html, "MAX_ROWS", 3)
    wave = incident["waves"][1]
    truth = _truth_pairs(wave)
    html = _report(wave)
    pairs = section(html, "Affected pairs")
    assert f"{len(truth) - 3} more pairs not shown here (of {len(truth)})" in pairs.text
    for row in pairs.table("By request").records():
        expected = []
        for pool, pages in sorted(truth[(row["Reader"], row["Source"])].items()):
            runs = _runs(pages)
            left = len(pages) - (runs[0][1] - runs[0][0] + 1)  # one range shown per pool
            expected.append(f"{pool}: {_ranges(runs[:1])}"
                            + (f" +{left} more page{'s' if left > 1 else ''} (in state.json)" if left else ""))
        assert row["Pages"] == "; ".join(expected), row
    # the admission alert names every placeholder (both waves): two shown, the rest counted
    placeholders = wave["over_long"]
    row = next(r for r in section(html, "Alerts").table("").records()
               if r["Alert and its detail"].startswith("admission_rejected"))
    assert row["Requests"].endswith(f"+{len(placeholders) - 2} more requests (in state.json)"), row
    assert len(row["Requests"].split(" +")[0].split(", ")) == 2


def test_the_page_maps_at_the_first_crossing_or_why_not(incident):
    wave = incident["waves"][1]
    opened = wave["bundle"]
    maps = section(_report(wave), "Page maps").text
    first_read = min(r["time"] for r in wave["truth"])
    if opened.first_crossing:  # an engine that keeps keyframes around each first crossing
        assert "pagemap-first-crossing-decode-0.png" in opened.images
        frame = opened.first_crossing["decode-0"]
        assert abs(frame["time"] - first_read) < 5.0
        assert "decode-0 at the first crossing, " in maps and "not available" not in maps
    else:
        assert "The page maps at the first crossing are not available: " in maps
        assert "these maps do not show the leak" in maps
