"""Issue 15: a real `serve` forwards its alerts to an Alertmanager-compatible receiver on
loopback (POST /api/v2/alerts, the v2 format), resends them while firing, counts what it sent
in status and /metrics, and keeps serving when the receiver is down — or hostile: a 1 GiB
answer costs the supervisor no memory, a ?token= in the URL is shown to no viewer."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from engine.client import RemoteError
from engine.config import REPO_ROOT
from engine.http.prometheus_text import exposition
from engine.wire.alert_kinds import BY_NAME
from tests.alertmanager_receiver import AlertmanagerReceiver, Answer
from tests.engine.server.test_alert_forward_bounds import HUGE, MAX_WRITTEN

SMALL = {"engine": {"context_window": 1024}, "pools": {"prefill": {"pages": 4}, "decode": {"pages": 8}}}
TOO_LONG = [256] + [65] * 64  # 65 tokens: the prefill pool holds 64


@pytest.fixture
def receiver():
    receiver = AlertmanagerReceiver()
    yield receiver
    receiver.close()


def reject(client, request_id: str) -> None:
    with pytest.raises(RemoteError) as err:
        client.generate(TOO_LONG, max_new_tokens=2, request_id=request_id)
    assert err.value.code == "admission_rejected"


def wait_status(client, predicate, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not predicate(status := client.status()):
        assert time.monotonic() < deadline, status["alert_forwarding"]
        time.sleep(0.1)
    return status


def test_an_admission_rejection_reaches_alertmanager_and_is_resent(start_server, receiver):
    server = start_server(alerts={"webhook_url": receiver.url, "webhook_resend_s": 1}, **SMALL)
    assert server.ready["alert_webhook"] == receiver.url + "/api/v2/alerts"
    client = server.client()
    before = time.time()
    reject(client, "too-long-1")
    got = receiver.wait_for(lambda got: any(a["labels"]["alertname"] == "admission_rejected" for a in got))
    alert = next(a for a in got if a["labels"]["alertname"] == "admission_rejected")
    labels, notes = alert["labels"], alert["annotations"]
    assert labels["severity"] == "info" and labels["pagewarden_alert_id"].startswith("admission_rejected")
    assert labels["instance"].startswith("tcp://") and labels["instance"].endswith(server.control.rsplit(":", 1)[1])
    assert "too-long-1" in notes["requests"] and "65" in notes["description"]
    assert notes["help"] == BY_NAME["admission_rejected"].help
    started = datetime.fromisoformat(alert["startsAt"])
    assert started.tzinfo == timezone.utc and before - 1 <= started.timestamp() <= time.time()
    assert "endsAt" not in alert  # firing
    # firing alerts are sent again (every webhook_resend_s), same episode
    again = receiver.wait_for(lambda got: len([a for a in got if a["labels"] == labels]) >= 2, timeout_s=20)
    assert {a["startsAt"] for a in again if a["labels"] == labels} == {alert["startsAt"]}
    status = wait_status(client, lambda s: s["alert_forwarding"]["sent"] >= 2)
    forwarding = status["alert_forwarding"]
    assert forwarding["enabled"] and forwarding["failed"] == forwarding["dropped"] == 0
    assert status["config"]["alerts"]["webhook_url"] == receiver.url
    metrics = exposition(status).decode()
    assert f"pagewarden_alerts_forwarded_total {float(forwarding['sent'])}" in metrics


def test_a_receiver_that_is_down_never_stops_the_engine(start_server, receiver):
    server = start_server(**SMALL)  # forwarding off: turned on by reconfigure
    client = server.client()
    assert client.status()["alert_forwarding"]["enabled"] is False
    down = "http://127.0.0.1:9"  # discard port: nobody listens
    client.reconfigure({"alerts": {"webhook_url": down}}, apply=True)
    reject(client, "too-long-down")
    status = wait_status(client, lambda s: s["alert_forwarding"]["failed"] >= 1)
    assert status["alert_forwarding"]["sent"] == 0 and "127.0.0.1:9" in status["alert_forwarding"]["last_error"]
    done = client.generate([256, 65, 66], max_new_tokens=2, ignore_eos=True)  # still serving
    assert len(done["token_ids"]) == 2
    # pointed at a receiver that answers, it hears the alert that is still firing
    client.reconfigure({"alerts": {"webhook_url": receiver.url}}, apply=True)
    receiver.wait_for(lambda got: any(a["labels"]["alertname"] == "admission_rejected" for a in got))
    (rejected,) = receiver.alerts("admission_rejected")
    assert "too-long-down" in rejected["annotations"]["requests"]
    # so does the standing capacity finding (a window of 1,024 over a 64-token prefill pool)
    assert receiver.alerts("capacity_exceeds_window")[0]["labels"]["severity"] == "critical"


def peak_rss_kib(pid: int) -> int:
    """A process's peak resident memory so far (VmHWM), KiB."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1])


def test_a_hostile_receiver_costs_the_supervisor_no_memory_and_viewers_no_secret(start_server, receiver):
    # every client a viewer; the standing capacity finding (SMALL) is resent every second
    url = receiver.url + "/am?token=s3cret"
    server = start_server("--local-role", "viewer", alerts={"webhook_url": url, "webhook_resend_s": 1}, **SMALL)
    client = server.client()
    receiver.wait_for(lambda got: any(a["labels"]["alertname"] == "capacity_exceeds_window" for a in got))
    wait_status(client, lambda s: s["alert_forwarding"]["sent"] >= 1)  # the forwarder is warm
    before = peak_rss_kib(server.proc.pid)
    receiver.then = Answer(500, **HUGE)  # from now on every POST is answered with 1 GiB
    status = wait_status(client, lambda s: s["alert_forwarding"]["failed"] >= 2)
    grown = peak_rss_kib(server.proc.pid) - before
    # (a few MB: the supervisor answers status meanwhile; 2.2 GB when the forwarder read it all)
    assert grown <= 16 * 1024, f"the supervisor's peak RSS grew {grown:,} KiB: at most 16,384"
    assert client.call("ping")["pong"]  # still answering
    assert "answered 500 (a body of 1,073,741,824 bytes" in status["alert_forwarding"]["last_error"]
    written = receiver.wait_written(len(receiver.paths))  # (every answer begun has ended)
    assert 0 < max(written) < MAX_WRITTEN, written  # the rest of each 1 GiB was never asked for
    # the secret reached the receiver, and nobody else
    assert all(path.endswith("/am/api/v2/alerts?token=s3cret") for path in receiver.paths)
    assert status["alert_forwarding"]["url"] == receiver.url + "/am/api/v2/alerts"
    assert status["config"]["alerts"]["webhook_url"] == receiver.url + "/am"
    assert "s3cret" not in json.dumps(status) and "s3cret" not in json.dumps(server.ready)
    assert "s3cret" not in server.log_path.read_text()


def test_a_bad_alert_webhook_is_refused_with_the_value(tmp_path):
    proc = subprocess.run([sys.executable, "main.py", "serve", "--alert-webhook", "ftp://alertmanager:9093"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "--alert-webhook = 'ftp://alertmanager:9093' is not an http:// or https:// URL" in proc.stdout + proc.stderr


def test_a_webhook_secret_reaches_no_viewer_through_history_or_the_journal(start_server, receiver):
    """status was redacted; the audit's reconfigure events (which `history`, a viewer op, returns)
    and the journal's run record kept the raw URL, query secret and all."""
    from engine.evidence.journal_read import JournalReader

    server = start_server(alerts={"webhook_url": receiver.url + "/am?token=s3cret"})
    client = server.client()
    client.call("reconfigure", changes={"alerts": {"webhook_url": receiver.url + "/am?token=n3wsecret"}},
                apply=True, timeout_s=120)
    history = client.call("history", timeout_s=120)
    shown = json.dumps(history, default=str)
    assert "reconfigure_requested" in shown and "reconfigured" in shown  # the events are there
    assert "s3cret" not in shown and "n3wsecret" not in shown
    status = client.status()
    client.call("ping")
    server.stop()
    runs = JournalReader(status["evidence"]["journal"]).runs()
    assert runs and "s3cret" not in json.dumps(runs, default=str)
