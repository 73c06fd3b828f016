"""CanaryBook (schedule, markers, black-box search) and ReadLog (bounded, scoping)."""

from __future__ import annotations

from engine.guard.canaries import KEEP, CanaryBook
from engine.guard.read_log import ReadLog, ReadRecord


def test_canaries_are_due_on_their_schedule_and_not_when_disabled():
    book = CanaryBook(per_minute=6, marker_chars=16)
    start = book._last
    assert not book.due(start + 9.9)
    assert book.due(start + 10.0)
    assert not book.due(start + 19.9)  # the clock restarts at each canary
    assert book.due(start + 20.0)
    book.enabled = False
    assert not book.due(start + 1000)
    assert not CanaryBook(per_minute=0, marker_chars=16).due(1e12)


def test_markers_are_fresh_and_of_the_configured_length():
    book = CanaryBook(per_minute=3, marker_chars=24)
    markers = {book.new_marker() for _ in range(200)}
    assert len(markers) == 200 and all(len(m) == 24 and m.isalnum() for m in markers)
    marker = book.new_marker()
    assert marker in book.prompt(marker)


def test_the_marker_sequence_is_found_in_other_outputs_only():
    book = CanaryBook(per_minute=3, marker_chars=4)
    canary = book.add("canary-7", 7, "abcd", [97, 98, 99, 100])
    assert book.markers_in([1, 2, 97, 98, 99, 100, 5]) == [canary]
    assert book.markers_in([97, 98, 99, 100], exclude_slot=7) == []  # the canary's own output
    assert book.markers_in([97, 98, 99, 5, 100]) == []  # not contiguous
    assert book.markers_in([97, 98, 99]) == []  # shorter than the marker
    assert book.is_canary_slot(7) and not book.is_canary_slot(8)


def test_the_book_keeps_a_bounded_number_of_canaries():
    book = CanaryBook(per_minute=3, marker_chars=4)
    for slot in range(KEEP + 10):
        book.add(f"canary-{slot}", slot, "m", [1])
    assert len(book.by_slot) == KEEP and len(book.by_request) == KEEP
    assert not book.is_canary_slot(0) and book.is_canary_slot(KEEP + 9)
    assert "canary-0" not in book.by_request


def _read(t, reader, reader_slot, source, source_slot, page, pool="decode-0"):
    return ReadRecord(t, reader, reader_slot, source, source_slot, pool, page)


def test_scope_aggregates_pairs_with_pages_and_times_in_the_window():
    log = ReadLog()
    log.add(_read(10.0, "r1", 1, "s1", 11, page=5))
    log.add(_read(12.0, "r1", 1, "s1", 11, page=6))
    log.add(_read(12.5, "r1", 1, "s1", 11, page=5))
    log.add(_read(20.0, "r2", 2, "s1", 11, page=5, pool="decode-1"))
    log.add(_read(30.0, "r1", 1, "s2", 12, page=9))
    pairs = log.scope()
    assert [(p["source"], p["reader"]) for p in pairs] == [("s1", "r1"), ("s1", "r2"), ("s2", "r1")]
    first = pairs[0]
    assert first["pages"] == [["decode-0", 5], ["decode-0", 6]]
    assert (first["first"], first["last"], first["reads"]) == (10.0, 12.5, 3)
    assert pairs[1]["pages"] == [["decode-1", 5]]
    windowed = log.scope(since=11.0, until=25.0)
    assert [(p["source"], p["reader"], p["reads"]) for p in windowed] == [("s1", "r1", 2), ("s1", "r2", 1)]
    assert log.scope(since=31.0) == []


def test_the_read_log_is_bounded_but_counts_everything():
    log = ReadLog(max_buckets=100)
    for i in range(250):  # one read per second: one aggregate each
        log.add(_read(float(i), "r", 1, "s", 2, page=i))
    assert len(log.buckets) == 100 and log.total == 250 and log.dropped_reads == 150
    (pair,) = log.scope()
    assert pair["reads"] == 100 and pair["first"] == 150.0  # the oldest aggregates went first
    assert log.incomplete_before(None) == 149.0 and log.incomplete_before(100.0) == 149.0
    assert log.incomplete_before(149.5) is None


def test_a_million_reads_of_an_incident_are_all_scoped():
    """Issue 15: the log held the last 200,000 reads, so an incident's early reads were gone
    before the snapshot. Aggregated per second and pair, a million reads fit and all count."""
    log = ReadLog()
    for i in range(1_000_000):  # 50 readers of 4 sources over 100 seconds, 8 pages each
        reader, source = i % 50, i % 4
        log.add(_read(1000.0 + i / 10_000, f"r{reader}", reader, f"s{source}", 100 + source, page=i % 8))
    assert log.total == 1_000_000 and log.dropped_reads == 0 and log.incomplete_before(None) is None
    pairs = log.scope()
    assert sum(p["reads"] for p in pairs) == 1_000_000
    assert len(pairs) == 100  # r_k reads s_(k mod 4) only: i = k (mod 50) fixes i mod 2
    assert all(len(p["pages"]) == 2 for p in pairs)  # i mod 100 fixed: i mod 8 takes 2 values
    windowed = log.scope(since=1050.0, until=1059.9999)
    assert sum(p["reads"] for p in windowed) == 100_000


def test_a_source_learned_later_names_the_pair():
    log = ReadLog()
    log.add(_read(5.0, "r1", 1, None, 7, page=1))
    log.add(_read(5.5, "r1", 1, "victim", 7, page=2))
    (pair,) = log.scope()
    assert pair["source"] == "victim" and pair["reads"] == 2


def test_scheduled_canaries_wait_while_two_are_still_running():
    book = CanaryBook(per_minute=60, marker_chars=4)
    start = book._last
    assert book.due(start + 1)
    book.add("canary-1", 1, "a", [1])
    assert book.due(start + 2)
    book.add("canary-2", 2, "b", [2])
    assert not book.due(start + 3) and book.skipped == 1  # MAX_LIVE running: the probe waits
    book.finished("canary-1")
    assert book.due(start + 4)


def test_a_canary_that_never_finishes_stops_holding_the_schedule_back():
    book = CanaryBook(per_minute=60, marker_chars=4)
    start = book._last
    for slot in (1, 2):
        book.add(f"canary-{slot}", slot, "m", [1])
    assert not book.due(start + 1)
    for canary in book.by_request.values():
        canary.sent -= 601  # sent more than LIVE_TIMEOUT_S ago
    assert book.due(start + 2) and not book.live


def test_scenario_rows_name_the_defences_they_turn_off():
    import pytest

    from engine.guard.scenarios import DEFENCES, defences_for

    assert defences_for("all on") == {d: True for d in DEFENCES}
    assert defences_for("scrub off") == {**{d: True for d in DEFENCES}, "scrub": False}
    both = defences_for("manifest_check+writer_tag_check off")
    assert [d for d, on in both.items() if not on] == ["manifest_check", "writer_tag_check"]
    with pytest.raises(ValueError, match="unknown defences \\['scrubbing'\\]"):
        defences_for("scrubbing off")


def test_new_pairs_are_counted_once_with_the_newest_kept():
    log = ReadLog()
    log.add(_read(1.0, "r1", 1, "s1", 11, page=1))
    log.add(_read(1.5, "r1", 1, "s1", 11, page=2))  # the same pair
    log.add(_read(2.0, "r2", 2, "s1", 11, page=1))
    assert log.pair_count == 2
    assert [(p["seq"], p["reader"], p["source"]) for p in log.recent_pairs] == [(1, "r1", "s1"), (2, "r2", "s1")]
