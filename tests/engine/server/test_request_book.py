"""RequestBook: the request state machine, every edge in one place; an edge not declared
raises, ending is once only, a failed reservation keeps the request's place in line."""

from __future__ import annotations

import pytest

from engine.server.request_book import EDGES, RequestBook
from engine.server.request_record import DONE, Phase, RequestRecord


def _rec(rid: str, slot: int) -> RequestRecord:
    return RequestRecord(rid, slot, "default", [1, 2, 3], {"max_new_tokens": 4}, None, None)


def test_the_happy_path_and_the_lines():
    book = RequestBook()
    a, b = _rec("a", 1), _rec("b", 2)
    book.admit(a), book.admit(b)
    assert list(book.queue) == ["a", "b"] and book.waiting() == 2 and book.slot_owner(2) == "b"
    book.reserve(a)
    assert a.phase == Phase.RESERVING and book.reserving == {"a"}
    book.reserved(a, {"epoch": 1})
    assert a.phase == Phase.AWAITING_PREFILL and book.next_for_prefill() is a and not book.reserving
    book.prefill(a)
    assert a.phase == Phase.PREFILLING and book.next_for_prefill() is None
    book.decoding(a)
    assert book.running() == 1
    assert book.end(a, Phase.FINISHED, "length") and a.done and a.finish_reason == "length"
    assert not book.end(a, Phase.FAILED, "late")  # once only
    assert a.phase == Phase.FINISHED and a.finish_reason == "length"


def test_a_failed_reservation_keeps_its_place_in_line():
    book = RequestBook()
    a, b = _rec("a", 1), _rec("b", 2)
    book.admit(a), book.admit(b)
    book.reserve(a)
    book.reserve_failed(a)
    assert list(book.queue) == ["a", "b"] and a.phase == Phase.QUEUED


@pytest.mark.parametrize("start", [p for p in Phase if p not in DONE])
def test_every_undeclared_edge_raises(start):
    book = RequestBook()
    rec = _rec("x", 1)
    book.admit(rec)
    rec.phase = start
    moves = {Phase.RESERVING: lambda: book.reserve(rec), Phase.AWAITING_PREFILL: lambda: book.reserved(rec, {}),
             Phase.QUEUED: lambda: book.reserve_failed(rec), Phase.PREFILLING: lambda: book.prefill(rec),
             Phase.DECODING: lambda: book.decoding(rec)}
    for to, move in moves.items():
        if to in EDGES[start]:
            continue
        with pytest.raises(ValueError, match="transition|head of the line|next for prefill"):
            move()
        assert rec.phase == start  # nothing changed


def test_ending_removes_it_from_every_line_and_old_records_are_forgotten():
    book = RequestBook(keep_done=2)
    recs = [_rec(f"r{i}", i) for i in range(6)]
    for rec in recs:
        book.admit(rec)
    book.reserve(recs[0])
    book.end(recs[0], Phase.CANCELLED, "cancelled")
    book.end(recs[1], Phase.REJECTED, "no")
    assert "r0" not in book.reserving and list(book.queue) == ["r2", "r3", "r4", "r5"]
    with pytest.raises(ValueError, match="does not end"):
        book.end(recs[2], Phase.DECODING, "x")
    for rec in recs[2:5]:
        book.end(rec, Phase.FINISHED, "stop")
    book.admit(_rec("r6", 6))  # 7 records > 2 * keep_done: the oldest ended go
    book.forget_old()
    assert len(book) == 2 and "r5" in book and "r6" in book and book.slot_owner(0) is None


def test_budgets_count_live_requests_and_tokens_per_client():
    from engine.errors import BudgetExceeded
    from engine.server.request_book import RequestBook
    from engine.server.request_record import Phase, RequestRecord

    book = RequestBook()
    recs = [RequestRecord(f"r{i}", i, "default", [1] * 10, {"max_new_tokens": 90}, b"c", i, budget_key="a")
            for i in range(3)]
    for rec in recs[:2]:
        book.check_budget("a", rec.request_id, 100, 2, 1000)
        book.admit(rec)
    with pytest.raises(BudgetExceeded, match="this client has 2 requests"):
        book.check_budget("a", "r2", 100, 2, 1000)
    with pytest.raises(BudgetExceeded, match="would give this client 1,200 queued or running"):
        book.check_budget("a", "r2", 1000, 5, 1000)
    book.check_budget("b", "x", 100, 2, 1000)  # another client's budget is its own
    book.end(recs[0], Phase.CANCELLED, "cancelled")
    book.check_budget("a", "r2", 100, 2, 1000)  # the ended one no longer counts
    book.end(recs[1], Phase.FINISHED, "length")
    assert "a" not in book.live_requests and "a" not in book.live_tokens
