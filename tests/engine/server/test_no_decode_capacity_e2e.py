"""An engine whose only decode worker is stopped cannot serve: a critical no_decode_capacity
alert says so at once, and it resolves when a decode worker is ready again."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.e2e


def _alert(client, state: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        found = [a for a in client.status()["alerts"] if a["kind"] == "no_decode_capacity"]
        if found and found[-1]["state"] == state:
            return found[-1]
        assert time.monotonic() < deadline, found
        time.sleep(0.1)


def test_stopping_the_only_decode_worker_raises_no_decode_capacity_until_one_is_ready(start_server):
    server = start_server()
    client = server.client()
    assert not [a for a in client.status()["alerts"] if a["kind"] == "no_decode_capacity"]  # start-up is no outage
    client.call("stop", worker="decode-0")
    alert = _alert(client, "firing")
    assert alert["severity"] == "critical" and "no decode worker is ready" in alert["detail"]
    server.wait_workers(client, state="stopped", names=["decode-0"])
    client.call("start", worker="decode-0")
    server.wait_workers(client)
    assert _alert(client, "resolved")["episode"] == 1
