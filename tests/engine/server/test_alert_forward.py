"""Issue 15: alerts forwarded to an Alertmanager-compatible webhook — the v2 payload, the
bounded queue, retries with backoff, resends and resolutions, against a real HTTP receiver
on loopback (the supervisor end to end: test_alert_forward_e2e.py)."""

from __future__ import annotations

import socket
import threading
import time
from datetime import datetime

import pytest

from engine.server.alert_forward import AlertForwarder, instance_label, to_alertmanager, webhook_endpoint
from engine.wire.alert_kinds import BY_NAME
from tests.alertmanager_receiver import AlertmanagerReceiver

INSTANCE = "tcp://gpu-box:5650"


def record(aid="admission_rejected:prefill", kind="admission_rejected", state="firing", severity="info",
           first_seen=1_767_322_245.5, **extra) -> dict:
    """An AlertBook record (engine/server/alerts.py)."""
    return {"id": aid, "kind": kind, "subject": aid.partition(":")[2], "first_seen": first_seen, "count": 3,
            "acked": False, "requests": ["r-1", "r-2"], "pages": [], "transitions": [], "state": state,
            "severity": severity, "detail": "request r-2 needs 65 tokens of the prefill pool, which holds 64\nmore",
            "last_seen": first_seen + 1, **extra}


@pytest.fixture
def receivers():
    made = []

    def make(*args, **kwargs) -> AlertmanagerReceiver:
        made.append(AlertmanagerReceiver(*args, **kwargs))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


@pytest.fixture
def forwarders():
    made = []

    def make(url: str, *, resend_s: float = 60.0, queue: int = 1000, **kwargs) -> AlertForwarder:
        forwarder = AlertForwarder(instance=INSTANCE, gather_s=kwargs.pop("gather_s", 0.01), **kwargs)
        forwarder.configure(url, resend_s=resend_s, queue=queue)
        made.append(forwarder)
        return forwarder

    yield make
    for forwarder in made:
        forwarder.stop()


def wait_until(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_record_becomes_an_alertmanager_v2_alert():
    alert = to_alertmanager(record(pool="prefill-0"), instance=INSTANCE, generator_url="http://grafana:3000/d/pw")
    assert alert["labels"] == {"alertname": "admission_rejected", "severity": "info", "pool": "prefill-0",
                               "pagewarden_alert_id": "admission_rejected:prefill", "instance": INSTANCE}
    notes = alert["annotations"]
    assert notes["summary"] == "request r-2 needs 65 tokens of the prefill pool, which holds 64"  # first line
    assert notes["description"].endswith("\nmore") and notes["requests"] == "r-1, r-2"
    assert notes["help"] == BY_NAME["admission_rejected"].help
    assert notes["runbook"].startswith("1. ") and BY_NAME["admission_rejected"].runbook[0] in notes["runbook"]
    assert all(isinstance(v, str) for v in [*alert["labels"].values(), *notes.values()])  # the v2 API's types
    assert alert["startsAt"] == "2026-01-02T02:50:45.500Z"
    assert datetime.fromisoformat(alert["startsAt"]).timestamp() == 1_767_322_245.5
    assert "endsAt" not in alert and alert["generatorURL"] == "http://grafana:3000/d/pw"
    resolved = to_alertmanager(record(state="resolved", resolved_at=1_767_322_305.0), instance=INSTANCE)
    assert resolved["endsAt"] == "2026-01-02T02:51:45.000Z" and "generatorURL" not in resolved


def test_endpoint_and_instance():
    assert webhook_endpoint("http://am:9093") == webhook_endpoint("http://am:9093/") == "http://am:9093/api/v2/alerts"
    assert webhook_endpoint("http://am:9093/api/v2/alerts") == "http://am:9093/api/v2/alerts"
    assert instance_label("tcp://10.0.0.5:5650") == "tcp://10.0.0.5:5650"
    # two engines on loopback on two machines are two instances
    assert instance_label("tcp://127.0.0.1:5650") == f"tcp://{socket.gethostname()}:5650"


def test_forwarded_resent_while_firing_and_ended_when_resolved(receivers, forwarders):
    receiver = receivers()
    forwarder = forwarders(receiver.url, resend_s=0.3)
    forwarder.offer(record())
    forwarder.offer(record(kind="worker_crashed", aid="worker_crashed:decode-0", severity="critical",
                           worker="decode-0"))
    forwarder.offer(record(aid="worker_unresponsive:x", kind="worker_unresponsive", state="pending"))  # not sent
    receiver.wait_for(lambda got: len([a for a in got if a["labels"]["alertname"] == "admission_rejected"]) >= 3)
    assert not receiver.alerts("worker_unresponsive")  # Alertmanager knows no pending alerts
    assert receiver.alerts("worker_crashed")[0]["labels"]["worker"] == "decode-0"
    firing = receiver.alerts("admission_rejected")
    assert all("endsAt" not in a and a["startsAt"] == firing[0]["startsAt"] for a in firing)
    forwarder.offer(record(state="resolved", resolved_at=1_767_322_400.0))
    got = receiver.wait_for(lambda got: any("endsAt" in a for a in got))
    (ended,) = [a for a in got if "endsAt" in a]
    assert ended["labels"]["pagewarden_alert_id"] == "admission_rejected:prefill"
    time.sleep(0.7)  # resolved: no longer resent
    assert receiver.alerts("admission_rejected")[-1] == ended
    status = forwarder.describe()
    assert status["sent"] == len(receiver.alerts()) and status["failed"] == status["dropped"] == 0
    assert status["firing"] == 1 and status["queued"] == 0


def test_a_repeat_of_a_firing_alert_is_not_sent_again_at_once(receivers, forwarders):
    receiver = receivers()
    forwarder = forwarders(receiver.url, resend_s=60)
    forwarder.offer(record())
    receiver.wait_for(lambda got: len(got) == 1)
    for count in range(4, 20):  # the alert book republishes a busy alert once a second
        forwarder.offer(record(count=count))
    time.sleep(0.3)
    assert len(receiver.alerts()) == 1  # the next resend carries the latest count
    # a severity change is another alert to Alertmanager: the old one ends, the new one starts
    forwarder.offer(record(severity="warning"))
    got = receiver.wait_for(lambda got: len(got) == 3)
    assert {(a["labels"]["severity"], "endsAt" in a) for a in got[1:]} == {("info", True), ("warning", False)}


def test_the_queue_is_bounded_and_drops_the_oldest(receivers, forwarders):
    hold = threading.Event()
    receiver = receivers(hold=hold)
    forwarder = forwarders(receiver.url, queue=3, max_batch=1)
    forwarder.offer(record(aid="admission_rejected:a0"))
    assert receiver.arrived.wait(10)  # the receiver holds the first POST: nothing more goes out
    started = time.monotonic()
    for i in range(1, 10):
        forwarder.offer(record(aid=f"admission_rejected:a{i}"))
    assert time.monotonic() - started < 1.0  # the offering side never waits on the receiver
    status = forwarder.describe()
    assert status["queued"] == 3 and status["dropped"] == 6
    hold.set()
    got = receiver.wait_for(lambda got: len(got) == 4)
    assert [a["labels"]["pagewarden_alert_id"] for a in got] == [f"admission_rejected:a{i}" for i in (0, 7, 8, 9)]
    wait_until(lambda: forwarder.describe()["sent"] == 4)


def test_a_receiver_that_is_down_is_retried_and_never_blocks(forwarders):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    forwarder = forwarders(url, backoff_s=(0.02, 0.1))
    started = time.monotonic()
    for i in range(50):
        forwarder.offer(record(aid=f"admission_rejected:{i}"))
    assert time.monotonic() - started < 1.0
    wait_until(lambda: forwarder.describe()["failed"] >= 3)
    status = forwarder.describe()
    assert status["sent"] == 0 and status["dropped"] == 0 and status["queued"] in (0, 50)  # 0: in flight
    assert "api/v2/alerts" in status["last_error"] and status["failing_since"] is not None


def test_a_failing_receiver_gets_the_alert_after_backoff(receivers, forwarders):
    receiver = receivers(answers=[503, 500])
    forwarder = forwarders(receiver.url, backoff_s=(0.05, 0.2))
    forwarder.offer(record())
    got = receiver.wait_for(lambda got: len(got) == 1)
    assert got[0]["labels"]["alertname"] == "admission_rejected"
    wait_until(lambda: forwarder.describe()["sent"] == 1)  # (counted once the answer is read)
    status = forwarder.describe()
    assert status["failed"] == 2 and status["failing_since"] is None and "answered 500" in status["last_error"]


def test_a_refused_batch_is_dropped_not_retried(receivers, forwarders):
    receiver = receivers(answers=[400])
    forwarder = forwarders(receiver.url, backoff_s=(0.05, 0.2))
    forwarder.offer(record())
    wait_until(lambda: forwarder.describe()["failed"] == 1)
    time.sleep(0.3)
    status = forwarder.describe()
    assert status["dropped"] == 1 and status["queued"] == 0 and status["sent"] == 0
    forwarder.offer(record(aid="admission_rejected:other"))  # the next one goes through
    receiver.wait_for(lambda got: len(got) == 1)


def test_a_new_receiver_hears_every_firing_alert_and_off_forgets_them(receivers, forwarders):
    first, second = receivers(), receivers()
    forwarder = forwarders(first.url)
    forwarder.offer(record())
    first.wait_for(lambda got: len(got) == 1)
    forwarder.configure(second.url, resend_s=60, queue=1000)
    second.wait_for(lambda got: len(got) == 1)
    forwarder.configure("")
    forwarder.offer(record(aid="admission_rejected:later"))
    status = forwarder.describe()
    assert not status["enabled"] and status["url"] is None and status["queued"] == status["firing"] == 0


def test_alerts_the_book_forgot_are_not_resent(receivers, forwarders):
    receiver = receivers()
    forwarder = forwarders(receiver.url, resend_s=0.2)
    forwarder.offer(record(aid="admission_rejected:kept"))
    forwarder.offer(record(aid="admission_rejected:evicted"))
    receiver.wait_for(lambda got: len(got) >= 2)
    forwarder.keep({"admission_rejected:kept"})
    seen = len(receiver.alerts())
    got = receiver.wait_for(lambda got: len(got) >= seen + 4)  # (a POST in flight may still carry both)
    assert [a["labels"]["pagewarden_alert_id"] for a in got[-2:]] == ["admission_rejected:kept"] * 2
    assert forwarder.describe()["firing"] == 1 and forwarder.describe()["dropped"] == 0


def test_an_alert_resolved_while_its_post_fails_leaves_its_end_queued_and_the_thread_alive():
    """The posting thread took a firing alert; it resolved meanwhile (its end queued); then the
    POST failed with retry. That once raised AttributeError on the posting thread, which ended
    forwarding for the rest of the run."""
    forwarder = AlertForwarder(instance=INSTANCE)
    forwarder.url = "http://127.0.0.1:9/"  # no posting thread: this test plays its part
    record = {"id": "canary_leak:r1", "kind": "canary_leak", "state": "firing", "severity": "critical",
              "first_seen": time.time(), "detail": "d", "count": 1}
    forwarder.offer(record)
    ends, firing = forwarder.take(time.time())
    assert ends == [] and len(firing) == 1
    forwarder.offer({**record, "state": "resolved", "resolved_at": time.time()})
    forwarder.undelivered(ends, firing, "HTTP 503", retry=True)
    status = forwarder.describe()
    assert status["queued"] == 1 and status["dropped"] == 0 and status["firing"] == 0
    (end,) = forwarder.take(time.time())[0]
    assert end["labels"]["pagewarden_alert_id"] == "canary_leak:r1" and "endsAt" in end
