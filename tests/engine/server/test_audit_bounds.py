"""The audit log stays bounded during an incident, and the `history` answer pages through it
(issue 15, item 1: a three-wave incident made a 154 MB answer that the client dropped
unseen, and the export waited for its timeout)."""

from __future__ import annotations

import pytest

from engine.client.engine_client import RemoteError
from engine.server.audit import MAX_EVENTS, MAX_LIST, AuditLog


def test_repeated_events_merge_per_role_and_outcome():
    log = AuditLog()
    log.record("r1", "admitted", slot=1)
    for i in range(500):
        log.record("r1", "alert:ownership_violation", prevented=False, role="reader", detail=f"x{i}")
        log.record("r1", "cross_read", reads=[[i, 7]] * 3, pool="decode-0")
    log.record("r1", "alert:ownership_violation", prevented=True, role="reader", detail="masked")
    log.record("r1", "alert:ownership_violation", prevented=False, role="source", detail="its data")
    log.record("r1", "finished", tokens=4)
    events = log.events("r1")
    assert [e["event"] for e in events] == ["admitted", "alert:ownership_violation", "cross_read",
                                            "alert:ownership_violation", "alert:ownership_violation", "finished"]
    alert, reads = events[1], events[2]
    assert alert["repeated"] == 500 and alert["detail"] == "x0" and alert["last_time"] >= alert["time"]
    assert reads["repeated"] == 500 and reads["reads_total"] == 1_500 and len(reads["reads"]) == 3
    # what reproduce scores is still there: one alert event per (role, prevented)
    assert {(e.get("role"), e.get("prevented")) for e in events if e["event"].startswith("alert:")} == {
        ("reader", False), ("reader", True), ("source", False)}


def test_lists_and_event_counts_are_capped():
    log = AuditLog()
    log.record("r1", "ownership_violation", pages=[{"page": p} for p in range(300)], prevented=False)
    event = log.events("r1")[0]
    assert len(event["pages"]) == MAX_LIST and event["pages_total"] == 300
    for i in range(MAX_EVENTS + 50):
        log.record("r2", "cancel_requested")
    events = log.events("r2")
    assert len(events) == MAX_EVENTS + 1 and events[-1]["event"] == "elided" and events[-1]["count"] == 50


def test_since_pages_in_first_seen_order():
    log = AuditLog()
    for i in range(10):
        log.record(f"r{i}", "admitted")
    first = log.since(0.0, limit=4)
    assert [s for s, _, _ in first] == ["r0", "r1", "r2", "r3"]
    rest = log.since(0.0, after=first[-1][2])
    assert [s for s, _, _ in rest] == [f"r{i}" for i in range(4, 10)]


def test_history_pages_against_a_real_engine(start_server):
    """A real engine with more requests than one page holds: every request comes back once,
    over several answers, and the export collector joins them."""
    server = start_server()
    client = server.client(timeout_s=60)
    ids = [f"page-{i}" for i in range(8)]
    for rid in ids:
        client.generate([5, 6, 7], max_new_tokens=2, request_id=rid)
    first = client.call("history", since=0.0, limit=3)
    seen = [r["request_id"] for r in first["requests"]]
    answers = 1
    page = first
    while page.get("next"):
        page = client.call("history", since=0.0, after=page["next"], limit=3)
        seen += [r["request_id"] for r in page["requests"]]
        answers += 1
        assert page["telemetry"] == []  # telemetry comes once, with the first page
    assert set(ids) <= set(seen) and len(seen) == len(set(seen)) and answers >= 3
    assert first["telemetry"]
    with pytest.raises(RemoteError, match="field 'limit' = 0: Expected `int` >= 1"):
        client.call("history", since=0.0, limit=0)


def test_an_answer_over_the_frame_limit_is_an_error_not_silence(monkeypatch):
    """The client's socket drops a frame over its limit without a word: the engine must never
    send one. A reply too big becomes an error naming the size and the limit."""
    from collections import Counter
    from types import SimpleNamespace

    from engine.server import control_call
    from engine.wire.protocol import Message, unpack

    sent = []
    outbox = SimpleNamespace(to_client=lambda identity, frames: sent.append(frames))
    counters: Counter[str] = Counter()
    monkeypatch.setattr(control_call, "MAX_CONTROL_FRAME", 1_000)

    def call(msg_id: int) -> control_call.Call:
        return control_call.Call(b"id", Message({"op": "history", "id": msg_id}), "local:id", "viewer", outbox,
                                 counters)

    call(9).reply({"requests": ["x" * 2_000]})
    answer = unpack(sent[0])
    assert answer.op == "error" and answer.get("error")["code"] == "answer_too_large"
    assert "2,0" in answer.get("error")["message"] and "1,000" in answer.get("error")["message"]
    assert counters["answers_too_large"] == 1
    call(10).reply({"requests": ["x" * 10]})
    assert unpack(sent[1]).op == "reply"


def test_forgotten_subjects_are_counted_with_the_newest_time_they_reached():
    """Memory keeps the newest requests; what it let go is counted, so that a window that reaches
    before `forgotten_until` is known to be partial here (the journal has it whole)."""
    from engine.server.audit import AuditLog

    log = AuditLog(max_requests=3)
    for i in range(5):
        log.record(f"r{i}", "admitted")
    assert log.forgotten == 2 and [s for s, _, _ in log.since(0.0)] == ["r2", "r3", "r4"]
    assert 0.0 < log.forgotten_until <= log.since(0.0)[0][1][0]["time"]
