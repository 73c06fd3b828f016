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


def test_a_flood_of_lower_alerts_never_evicts_critical_isolation_alerts():
    """Issue 14, item 5: 1,100 internal errors (one per sender) pushed out the real alerts."""
    from engine.server.alerts import MAX_ALERTS

    book, _ = _book()
    book.fire("ownership_violation", "critical", "slot 7 read page 40", subject="r7", requests=["r7"], pages=[40])
    book.fire("canary_leak", "critical", "r9 touched canary pages", subject="r9")
    book.fire("worker_crashed", "critical", "decode-0 killed", subject="decode-0", condition=True)
    for i in range(MAX_ALERTS + 100):
        book.fire("probe_error", "warning", f"round {i} failed", subject=f"peer-{i}")
    assert len(book.alerts) == MAX_ALERTS and book.evicted == 103
    for aid in ("ownership_violation:r7", "canary_leak:r9", "worker_crashed:decode-0"):
        assert aid in book.alerts, aid
    assert "probe_error:peer-0" not in book.alerts and f"probe_error:peer-{MAX_ALERTS + 99}" in book.alerts


def test_critical_isolation_alerts_are_kept_past_the_cap_up_to_their_own():
    from engine.server.alerts import MAX_ALERTS

    book, _ = _book()
    book.fire("probe_error", "warning", "one", subject="p")
    for i in range(MAX_ALERTS + 5):
        book.fire("transfer_mismatch", "critical", f"request r{i}", subject=f"r{i}")
    assert "probe_error:p" not in book.alerts  # the lower one went first
    assert len(book.alerts) == MAX_ALERTS + 5  # the evidence is kept (bounded by MAX_PROTECTED)


def test_an_alert_firing_again_and_again_is_published_at_most_once_a_second():
    from engine.server.alerts import REPUBLISH_S

    book, published = _book()
    for _ in range(500):
        book.fire("internal_error", "error", "bug", subject="control:KeyError")
    assert len(published) == 1 and book.alerts["internal_error:control:KeyError"]["count"] == 500
    book.flush(published[0]["last_seen"] + REPUBLISH_S + 0.01)
    assert len(published) == 2 and published[-1]["count"] == 500  # the held repeats, at once
    book.flush(published[0]["last_seen"] + 10 * REPUBLISH_S)
    assert len(published) == 2  # nothing more was held


def test_episodes_that_fired_are_counted_once_each_however_many_events():
    """Three incident waves of 570 events each read 1,710 on the old counter; an episode is one.
    A pending alert counts when it first fires, and not before."""
    book, _ = _book()
    for wave in range(3):
        for event in range(570):
            book.fire("ownership_violation", "critical", f"wave {wave} read {event}", subject="decode-0")
        book.expire(book.alerts["ownership_violation:decode-0"]["last_seen"] + QUIET_RESOLVE_S + 1)
        assert book.alerts["ownership_violation:decode-0"]["state"] == "resolved"
    assert book.fired["ownership_violation"] == 3
    book.pending("worker_unresponsive", "warning", "silent 10 s", subject="decode-0")
    assert book.fired["worker_unresponsive"] == 0
    book.fire("worker_unresponsive", "warning", "silent 20 s", subject="decode-0", condition=True)
    book.fire("worker_unresponsive", "warning", "silent 25 s", subject="decode-0", condition=True)
    assert book.fired["worker_unresponsive"] == 1
