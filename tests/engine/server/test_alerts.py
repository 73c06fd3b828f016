"""AlertBook: pending -> firing -> resolved, acknowledgement, aggregation, quiet resolve."""

from __future__ import annotations

from engine.server.alerts import QUIET_RESOLVE_S, AlertBook


def _book():
    published = []
    return AlertBook(published.append), published


def test_condition_alert_lifecycle():
    book, published = _book()
    book.pending("worker_unresponsive", "warning", "silent 10 s", subject="decode-0")
    book.fire("worker_crashed", "critical", "killed", subject="decode-0", condition=True)
    book.resolve("worker_unresponsive", "decode-0")
    assert [(p["id"], p["state"]) for p in published] == [
        ("worker_unresponsive:decode-0", "pending"), ("worker_crashed:decode-0", "firing"),
        ("worker_unresponsive:decode-0", "resolved")]
    book.expire(published[-1]["last_seen"] + 10 * QUIET_RESOLVE_S)
    assert book.alerts["worker_crashed:decode-0"]["state"] == "firing"  # conditions wait for their condition
    book.resolve("worker_crashed", "decode-0")
    assert book.alerts["worker_crashed:decode-0"]["state"] == "resolved"


def test_incidents_aggregate_and_resolve_after_quiet():
    book, published = _book()
    book.fire("transfer_mismatch", "critical", "checksum page 3", subject="decode-0", requests=["r1"], pages=[3])
    book.fire("transfer_mismatch", "critical", "checksum page 9", subject="decode-0", requests=["r2"], pages=[9, 3])
    record = book.alerts["transfer_mismatch:decode-0"]
    assert record["count"] == 2 and record["requests"] == ["r1", "r2"] and record["pages"] == [3, 9]
    assert record["detail"] == "checksum page 9"
    book.expire(record["last_seen"] + QUIET_RESOLVE_S / 2)
    assert record["state"] == "firing"
    book.expire(record["last_seen"] + QUIET_RESOLVE_S + 1)
    assert record["state"] == "resolved" and published[-1]["state"] == "resolved"


def test_acknowledge_and_a_new_episode_after_resolve():
    book, published = _book()
    book.fire("late_write_dropped", "warning", "late", subject="decode-0")
    assert book.acknowledge(["late_write_dropped:decode-0", "nope"]) == ["late_write_dropped:decode-0"]
    assert published[-1]["acked"] is True
    book.resolve("late_write_dropped", "decode-0")
    book.fire("late_write_dropped", "warning", "late again", subject="decode-0")
    record = book.alerts["late_write_dropped:decode-0"]
    assert record["state"] == "firing" and record["acked"] is False and record["count"] == 1
