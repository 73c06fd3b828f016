"""The receiver is not trusted: the forwarder reads at most MAX_ANSWER_BYTES of any answer
(a 500 or a 200 with 1 GiB of body, a gzip bomb), never follows a redirect, builds its POST
URL with urllib.parse, and shows no query string or user:password in status or the log —
each against a real HTTP receiver on loopback (the engine end to end:
test_alert_forward_e2e.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import zlib

import pytest

from engine.config import REPO_ROOT
from engine.server.alert_forward import MAX_ANSWER_BYTES, redacted_url, webhook_endpoint
from tests.alertmanager_receiver import Answer
from tests.engine.server import test_alert_forward as basics

receivers, forwarders = basics.receivers, basics.forwarders  # (the fixtures)
record, wait_until = basics.record, basics.wait_until

GIB = 1 << 30
CHUNK = b"x" * (1 << 16)
HUGE = {"body": CHUNK, "repeat": GIB // len(CHUNK)}  # 1 GiB, generated as it is written
MAX_GROWTH_KIB = 8 * 1024  # the forwarding process's peak RSS may grow this much (buffers, not bodies)
# a receiver may write this much before it notices the forwarder closed the connection: the
# loopback socket's buffers on both sides, aiohttp's read buffer and MAX_ANSWER_BYTES
MAX_WRITTEN = 64 << 20

# A forwarder alone in a process: one alert delivered (the session, the loop and the imports
# are warm), then the peak RSS; then one alert more, the peak RSS once `failed` POSTs failed
# and `sent` alerts were delivered.
FORWARDER = """
import json, sys, time
from engine.server.alert_forward import AlertForwarder

url, failed, sent = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def hwm_kib():
    # VmHWM, this process's own peak: ru_maxrss of a process started from pytest begins at
    # pytest's RSS (Linux keeps the larger across exec), which would hide growth below it
    status = open("/proc/self/status").read().splitlines()
    return int(next(x for x in status if x.startswith("VmHWM:")).split()[1])
def until(predicate):
    deadline = time.monotonic() + 120
    while not predicate():
        assert time.monotonic() < deadline, forwarder.describe()
        time.sleep(0.01)
def alert(aid):
    return {"id": aid, "kind": "admission_rejected", "state": "firing", "severity": "info",
            "first_seen": time.time(), "detail": "d", "count": 1}
forwarder = AlertForwarder(instance="tcp://test:1", backoff_s=(0.01, 0.01), gather_s=0.01)
forwarder.configure(url, resend_s=3600)
forwarder.offer(alert("admission_rejected:warm"))
until(lambda: forwarder.describe()["sent"] == 1)
before = hwm_kib()
forwarder.offer(alert("admission_rejected:measured"))
until(lambda: forwarder.describe()["failed"] >= failed and forwarder.describe()["sent"] >= sent)
after = hwm_kib()
print(json.dumps({"before_kib": before, "after_kib": after, "status": forwarder.describe()}))
"""


def forward_in_a_process(url: str, *, failed: int, sent: int) -> dict:
    """Run FORWARDER against `url`: its peak RSS before and after (KiB) and its status."""
    proc = subprocess.run([sys.executable, "-c", FORWARDER, url, str(failed), str(sent)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gzip_bomb(size: int) -> bytes:
    """`size` zero bytes as a gzip stream without its trailer (1 GiB -> 1 MiB): after a full
    flush each MiB of zeros compresses to the same bytes, so one is compressed and repeated."""
    packer, zeros = zlib.compressobj(9, zlib.DEFLATED, 31), bytes(1 << 20)
    first = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    return first + again * (size // len(zeros) - 1)


def test_a_500_with_a_1_gib_body_is_read_to_a_few_kib_on_every_retry(receivers):
    receiver = receivers(answers=[200], then=Answer(500, **HUGE))
    got = forward_in_a_process(receiver.url, failed=3, sent=1)
    grown = got["after_kib"] - got["before_kib"]
    assert grown <= MAX_GROWTH_KIB, f"the forwarder's peak RSS grew {grown:,} KiB: at most {MAX_GROWTH_KIB:,}"
    written = receiver.wait_written(4)[1:4]  # the warm-up's answer, then three of 1 GiB each
    assert all(w < MAX_WRITTEN for w in written), f"the receiver wrote {written} bytes before the forwarder left"
    error = got["status"]["last_error"]
    assert "answered 500" in error and f"{GIB:,} bytes" in error and f"{MAX_ANSWER_BYTES:,}" in error
    assert "x" * 100 in error and "x" * 201 not in error  # its first characters, clipped


def test_a_200_with_a_1_gib_body_and_a_gzip_bomb_are_not_read(receivers):
    bomb = Answer(500, gzip_bomb(GIB), headers={"Content-Encoding": "gzip"})
    receiver = receivers(answers=[200, bomb], then=Answer(200, **HUGE))
    got = forward_in_a_process(receiver.url, failed=1, sent=2)
    grown = got["after_kib"] - got["before_kib"]
    assert grown <= MAX_GROWTH_KIB, f"the forwarder's peak RSS grew {grown:,} KiB: at most {MAX_GROWTH_KIB:,}"
    assert got["status"]["sent"] == 2 and "answered 500" in got["status"]["last_error"]
    assert receiver.wait_written(3)[2] < MAX_WRITTEN


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_failed_delivery_never_followed(receivers, forwarders, status):
    receiver = receivers(answers=[Answer(status, headers={"Location": "/internal/other?secret=s3cret"})])
    forwarder = forwarders(receiver.url, backoff_s=(0.05, 0.2))
    forwarder.offer(record())
    got = receiver.wait_for(lambda got: len(got) == 1)  # retried by the normal policy, to the same URL
    assert got[0]["labels"]["alertname"] == "admission_rejected"
    assert receiver.paths == ["/api/v2/alerts"] * 2  # the Location was never asked
    wait_until(lambda: forwarder.describe()["sent"] == 1)
    forwarding = forwarder.describe()
    assert forwarding["failed"] == 1 and forwarding["dropped"] == 0
    error = forwarding["last_error"]
    assert f"answered {status}" in error and "/internal/other" in error and "not followed" in error
    assert "s3cret" not in error


def test_the_post_url_joins_the_path_and_keeps_the_query():
    assert webhook_endpoint("http://am:9093?token=X") == "http://am:9093/api/v2/alerts?token=X"
    assert webhook_endpoint("http://am:9093/?token=X") == "http://am:9093/api/v2/alerts?token=X"
    assert webhook_endpoint("http://am:9093/am/?token=X#top") == "http://am:9093/am/api/v2/alerts?token=X"
    assert webhook_endpoint("https://am/api/v2/alerts/?a=1&b=2") == "https://am/api/v2/alerts?a=1&b=2"
    assert webhook_endpoint("http://[::1]:9093") == "http://[::1]:9093/api/v2/alerts"


def test_a_shown_url_has_no_query_or_user():
    assert redacted_url("http://user:pw@am:9093/am/api/v2/alerts?token=X#f") == "http://am:9093/am/api/v2/alerts"
    assert redacted_url("http://[::1]:9093/?token=X") == "http://[::1]:9093/"
    assert redacted_url("/internal/other?secret=s") == "/internal/other"
    assert redacted_url("") == ""
    assert redacted_url("http://[::1") == "(a URL that does not parse)"


def test_a_query_secret_reaches_the_receiver_only(receivers, forwarders, capfd):
    receiver = receivers(answers=[503])
    forwarder = forwarders(receiver.url + "/am?token=s3cret", backoff_s=(0.05, 0.2))
    forwarder.offer(record())
    receiver.wait_for(lambda got: len(got) == 1)
    wait_until(lambda: forwarder.describe()["sent"] == 1)
    assert receiver.paths == ["/am/api/v2/alerts?token=s3cret"] * 2
    status = forwarder.describe()
    assert status["url"] == receiver.url + "/am/api/v2/alerts"
    assert "answered 503" in status["last_error"] and "s3cret" not in json.dumps(status)
    logged = capfd.readouterr().err
    assert "retrying" in logged and "takes alerts again" in logged and "s3cret" not in logged


def test_a_flood_of_headers_is_refused_and_retried(receivers, forwarders):
    flood = Answer(200, headers={f"X-Flood-{i}": "y" * 8000 for i in range(1000)})
    receiver = receivers(answers=[flood])
    forwarder = forwarders(receiver.url + "?token=s3cret", backoff_s=(0.05, 0.2))
    forwarder.offer(record())
    wait_until(lambda: forwarder.describe()["failed"] >= 1)
    assert "s3cret" not in forwarder.describe()["last_error"]
    receiver.wait_for(lambda got: len(got) == 2)  # the alert again, with the answer that was fine
