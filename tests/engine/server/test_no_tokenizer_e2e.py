"""Issue 14, item 7: a model without tokenizer.json made `serve` exit ~20 s after start (the
first canary called the tokenizer inside periodic(), outside any error handling). Now serve
runs, token-id prompts work, canaries say why they are off, and nothing in the periodic path
can end the loop."""

from __future__ import annotations

import shutil
import time

import pytest

from engine.config import TINY_RANDOM_MODEL_DIR, EngineConfig
from engine.server.supervisor import Supervisor

pytestmark = pytest.mark.e2e


def test_serve_runs_without_a_tokenizer_and_says_why_canaries_are_off(start_server, tmp_path):
    model = tmp_path / "no-tokenizer"
    shutil.copytree(TINY_RANDOM_MODEL_DIR, model)
    (model / "tokenizer.json").unlink()
    server = start_server(model={"path": str(model)}, canaries={"enabled": True, "per_minute": 600})  # one due every 0.1 s
    client = server.client()
    canaries = client.status()["canaries"]
    assert canaries["enabled"] is False and "no usable tokenizer" in canaries["off_reason"]
    assert "tokenizer.json" in canaries["off_reason"]
    time.sleep(1.0)  # ten canaries would have been due
    done = client.generate([256, 5, 6, 7], max_new_tokens=4, ignore_eos=True)
    assert len(done["token_ids"]) == 4
    server.check_alive()
    assert client.status()["counters"].get("internal_errors", 0) == 0


def test_an_exception_in_periodic_work_is_an_alert_not_the_end_of_the_loop(monkeypatch):
    sup = Supervisor(EngineConfig().replace(canaries={"per_minute": 600}), bind="tcp://127.0.0.1:0")  # no workers
    try:
        def broken():
            raise RuntimeError("tokenizer exploded")

        monkeypatch.setattr(sup.ops.submits, "fire_canary", broken)
        for worker in sup.workers.role("decode"):
            monkeypatch.setattr(type(worker), "accepting", property(lambda self: True))
        for _ in range(5):
            time.sleep(0.11)
            sup.poll_once(0)  # raised before: the loop (and serve) ended
        (alert,) = [a for a in sup.alerts.records() if a["kind"] == "internal_error"]
        assert alert["id"] == "internal_error:periodic:RuntimeError" and alert["count"] >= 2
        assert "its periodic work" in alert["detail"] and "tokenizer exploded" in alert["detail"]
    finally:
        sup.shutdown()
