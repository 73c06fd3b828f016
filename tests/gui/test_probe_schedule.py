"""The Qt-free probe schedule of the window: input checks that name the field and value,
run timing on an injected clock (no sleeps), and findings / errors -> local alert records."""

from __future__ import annotations

import re

import pytest

from engine.adapters.leak_probe import Finding, RoundReport
from engine.wire.sockets import is_loopback_host as is_loopback
from gui.model.probe_schedule import ALERT_PREFIX, ProbeRequest, ProbeSchedule, check_probe_request

URL = "http://127.0.0.1:8000"


def check(url=URL, model="", rounds=3, every=0, remote=False) -> ProbeRequest:
    return check_probe_request(url, model, rounds, every, remote, is_loopback=is_loopback)


def test_a_valid_request_is_normalised():
    request = check(" http://localhost:9000/ ", "  copy  ", 5, 10)
    assert request == ProbeRequest("http://localhost:9000/", "copy", 5, 10.0, False)
    assert check().model is None  # empty: the first model /v1/models lists


@pytest.mark.parametrize("args, words", [
    (dict(url="127.0.0.1:8000"), "URL '127.0.0.1:8000' must be http://HOST[:PORT]"),
    (dict(url="ftp://127.0.0.1"), "URL 'ftp://127.0.0.1' must be http://HOST[:PORT]"),
    (dict(url="http://127.0.0.1:99999"), "URL 'http://127.0.0.1:99999' has a port outside 0..65535"),
    (dict(url="http://10.1.2.3:8000"), "URL host 10.1.2.3 is not loopback"),
    (dict(url="http://gpu-box:8000"), "URL host gpu-box is not loopback"),
    (dict(rounds=0), "Rounds 0 is outside 1..50"),
    (dict(rounds=51), "Rounds 51 is outside 1..50"),
    (dict(every=-1), "Every -1 minutes is outside 0..1440"),
])
def test_bad_input_names_the_field_and_the_value(args, words):
    with pytest.raises(ValueError, match="^" + re.escape(words)):
        check(**args)


def test_allow_remote_lets_a_remote_host_through():
    assert check("http://10.1.2.3:8000", remote=True).allow_remote


def test_once_runs_one_time():
    schedule = ProbeSchedule(check(), started_at=100.0)
    assert schedule.due(100.0) and schedule.active
    schedule.start_run(100.0)
    assert not schedule.due(100.0) and not schedule.due(10_000.0) and schedule.active  # running
    schedule.end_run()
    assert not schedule.active and not schedule.due(10_000.0)
    assert schedule.status_text(200.0) == "probe: 0 rounds, 0 findings · done"


def test_every_n_minutes_counts_from_each_start_and_never_overlaps():
    schedule = ProbeSchedule(check(every=5), started_at=0.0)
    schedule.start_run(0.0)
    assert schedule.status_text(10.0).endswith("· running")
    assert not schedule.due(400.0)  # due at 300 s, but the first run is still going
    schedule.end_run()
    assert schedule.due(400.0)  # late: at once
    schedule.start_run(400.0)
    schedule.end_run()
    assert not schedule.due(699.0) and schedule.due(700.0)
    assert schedule.status_text(460.0).endswith("· next in 4 min")
    assert schedule.status_text(690.0).endswith("· next in 10 s")
    schedule.stop()
    assert not schedule.due(10_000.0) and not schedule.active
    assert schedule.status_text(800.0).endswith("· stopped") and schedule.runs == 2


def test_findings_become_critical_canary_marker_in_output_alerts():
    schedule = ProbeSchedule(check(model="copy"), started_at=5.0)
    schedule.start_run(5.0)
    markers = {1: "k3j9x0q2m8w7v6b5n4c3z2a1", 2: "p0o9i8u7y6t5r4e3w2q1a2s3"}
    report = RoundReport(2, marker_tokens=448, marker_repeated=True, followups=["answered", "answered"],
                         findings=[Finding(2, 1, "p0o9i8u7y6t5", 2), Finding(2, 2, "k3j9x0q2m8w7v6", 1)])
    alerts = schedule.add_round(report, markers, when=1_000.0)
    assert [a.kind for a in alerts] == ["canary_marker_in_output"] * 2
    first = alerts[0]
    assert first.severity == "critical" and first.state == "firing" and not first.acked
    assert first.id.startswith(ALERT_PREFIX) and len({a.id for a in alerts}) == 2
    assert first.first_seen == first.last_seen == 1_000.0 and first.requests == [] and first.pages == []
    head = first.detail.splitlines()[0]
    assert head.startswith(URL) and "round 2, follow-up 1" in head and "'p0o9i8u7y6t5'" in head
    assert "12 characters of round 2's marker 'p0o9i8u7y6t5r4e3w2q1a2s3'" in head
    assert "follow-up 2" in alerts[1].detail and "round 1's marker 'k3j9x0q2m8w7v6b5n4c3z2a1'" in alerts[1].detail
    assert schedule.add_round(RoundReport(3, followups=["rejected (HTTP 400 context_length_exceeded)"]), markers) == []
    assert (schedule.rounds, schedule.findings) == (2, 2)
    assert schedule.status_text(6.0) == "probe: 2 rounds, 2 findings · running"
    assert schedule.alerts == alerts


def test_errors_become_probe_error_warnings():
    schedule = ProbeSchedule(check(), started_at=0.0)
    schedule.start_run(0.0)
    error = schedule.add_error("cannot reach http://127.0.0.1:8000/v1/models: [Errno 111] Connection refused",
                               when=50.0)
    assert (error.kind, error.severity, error.state) == ("probe_error", "warning", "firing")
    assert error.detail.startswith(URL + ": cannot reach") and "Connection refused" in error.detail
    refused = schedule.add_round(RoundReport(1, marker_error="HTTP 400 context_length_exceeded: too long"), {})
    assert [a.kind for a in refused] == ["probe_error"] and "marker prompt refused: HTTP 400" in refused[0].detail
    schedule.end_run()
    assert schedule.status_text(1.0) == "probe: 1 round, 0 findings, 1 error · done"
    assert schedule.last_error.startswith("cannot reach")


def test_salt_check_reports_become_alerts_by_verdict():
    from engine.adapters.salt_check import HOLDS, INCONCLUSIVE, NO_CACHE, SHARED, SaltReport
    from gui.model.probe_schedule import SALT_SHARED_KIND

    request = check_probe_request(URL, salt_check=True, pairs=4, is_loopback=is_loopback)
    assert request.salt_check and request.pairs == 4
    with pytest.raises(ValueError, match=r"^Pairs 65 is outside 2\.\.64$"):
        check_probe_request(URL, salt_check=True, pairs=65)
    schedule = ProbeSchedule(request, 0.0)
    assert schedule.status_text(0.0) == "salt check: no verdict yet · next in 0 s"
    schedule.start_run(0.0)
    kinds = {}
    for verdict in (HOLDS, SHARED, NO_CACHE, INCONCLUSIVE):
        report = SaltReport(URL, "copy", 1000, False, verdict=verdict, reasons=[f"because {verdict}"])
        kinds[verdict] = [(a.kind, a.severity) for a in schedule.add_salt_report(report, when=1.0)]
    assert kinds == {HOLDS: [], SHARED: [(SALT_SHARED_KIND, "critical")], NO_CACHE: [("probe_error", "warning")],
                     INCONCLUSIVE: [("probe_error", "warning")]}
    assert schedule.alerts[0].detail.startswith(f"salt check {URL} model copy: {SHARED}\nbecause {SHARED}")
    assert all(a.id.startswith(ALERT_PREFIX) for a in schedule.alerts)
    schedule.end_run()
    assert schedule.status_text(5.0) == f"salt check: {INCONCLUSIVE} · done"
