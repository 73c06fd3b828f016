"""I1 in the engine: a token slot written by someone else (or by nobody this epoch) is masked,
reported with page, writer and reader, and the reading request is aborted before the token
reaches the client; with the defence off the read happens and is reported exactly where it
happens (the detector names the same readers as the provenance ground truth)."""

from __future__ import annotations

import time

import numpy as np
import torch

from engine.errors import OwnershipViolation
from engine.request import RequestState, SamplingParams
from engine.wire.page_tags import NO_WRITER, PageState, pack_tag


def _start_two(engine):
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    a = engine.submit([256] + [66] * 40, params, request_id="a")
    b = engine.submit([256] + [77] * 40, params, request_id="b")
    for _ in range(3):
        engine.step()
    return a, b


def _misdirected_write(engine, page: int, by_slot: int, epoch: int) -> None:
    """Another request's kernel writes one token into `page` (the store kernel stamps it)."""
    pool = engine.pool
    shape = (1, pool.layout.num_kv_heads, pool.layout.head_dim)
    for layer in range(pool.layout.num_layers):
        engine.kernels.store_kv(
            pool.k_cache(layer), pool.v_cache(layer), torch.ones(shape), torch.ones(shape),
            torch.tensor([page * pool.page_size]), torch.tensor([pack_tag(by_slot, epoch)]),
            pool.writer, pool.filled, pool.token_writer,
        )


def test_foreign_writer_aborts_the_reader_and_quarantines_the_page(make_engine):
    engine = make_engine(prefix_cache="off")  # its prompt pages stay its own (shared ones: test_prefix_cache)
    a, b = _start_two(engine)
    victim_page = int(a.page_table.pages[1])
    tokens_before = len(a.output_ids)
    _misdirected_write(engine, victim_page, by_slot=b.slot, epoch=int(engine.pool.epoch[victim_page]))
    outputs = {o.request_id: o for o in engine.step()}
    assert outputs["a"].finished and outputs["a"].new_token_ids == []
    assert isinstance(a.error, OwnershipViolation) and a.state == RequestState.FAILED
    assert len(a.output_ids) == tokens_before  # nothing computed from that page was emitted
    msg = str(a.error)
    assert f"page {victim_page}" in msg and f"written by ({b.slot}," in msg and "expected (" in msg
    assert a.error.pages[0]["page"] == victim_page and a.error.pages[0]["owner"] == a.slot
    assert engine.counters.ownership_violations == 1
    assert engine.counters.isolation_events[0]["request"] == "a"
    # a's other pages were freed; the quarantined one is held as evidence, then scrubbed
    # whatever the policy
    assert engine.pool.state[victim_page] == PageState.QUARANTINED and engine.pool.owner[victim_page] == a.slot
    assert engine.pool.release_quarantine(now=time.monotonic() + engine.pool.quarantine_s + 1) == 1
    assert engine.pool.owner[victim_page] == -1
    assert (engine.pool.data[victim_page] == 0).all()
    # The other request is untouched and finishes.
    engine.run_until_idle()
    assert b.state == RequestState.FINISHED and len(b.output_ids) == 20


def test_unwritten_slots_are_a_violation(make_engine):
    engine = make_engine()
    a, _ = _start_two(engine)
    page = int(a.page_table.pages[0])
    engine.pool.token_writer[page, 3:] = NO_WRITER  # as if a transfer wrote 3 of the 16 tokens
    engine.step()
    assert isinstance(a.error, OwnershipViolation)
    assert a.error.pages[0] == {**a.error.pages[0], "page": page, "unwritten_slots": 13, "foreign_slots": 0,
                                "needed": 16}
    assert "13 token slot(s) nothing wrote this epoch" in str(a.error)


def test_with_the_defence_off_the_detector_still_reports_and_the_read_happens(make_engine):
    engine = make_engine(defences={"writer_tag_check": False})
    a, b = _start_two(engine)
    page = int(a.page_table.pages[1])
    _misdirected_write(engine, page, by_slot=b.slot, epoch=int(engine.pool.epoch[page]))
    engine.pool.record_content(np.arange(page * 16, page * 16 + 1), np.array([b.slot]))  # b's data there now
    engine.step()
    events = engine.take_events()
    detections = [e for e in events if e["kind"] == "ownership_violation"]
    reads = [e for e in events if e["kind"] == "cross_read"]
    assert detections and detections[0]["request"] == "a" and detections[0]["prevented"] is False
    assert reads and reads[0]["request"] == "a" and [page, b.slot] in reads[0]["reads"]  # ground truth
    engine.run_until_idle()
    assert a.state == RequestState.FINISHED and a.error is None  # not prevented


def test_with_the_defence_on_the_same_fault_reads_nothing(make_engine):
    engine = make_engine()
    a, b = _start_two(engine)
    page = int(a.page_table.pages[1])
    _misdirected_write(engine, page, by_slot=b.slot, epoch=int(engine.pool.epoch[page]))
    engine.pool.record_content(np.arange(page * 16, page * 16 + 1), np.array([b.slot]))
    engine.step()
    events = engine.take_events()
    assert [e["kind"] for e in events] == ["ownership_violation"] and events[0]["prevented"] is True
    assert engine.counters.cross_reads == 0


def test_a_stale_page_table_entry_is_refused_for_reads_and_writes(make_engine):
    engine = make_engine(page_size=16)
    a = engine.submit([256] * 20, SamplingParams(max_new_tokens=30, ignore_eos=True), request_id="a")
    engine.step()
    b = engine.submit([256] * 5, SamplingParams(max_new_tokens=8, ignore_eos=True), request_id="b")
    engine.step()  # b prefilled
    stolen = int(b.page_table.pages[0])
    # a's table goes stale: its second page now points at b's page
    a.page_table.pages[1] = stolen
    engine.runner._tables_key = None
    engine.step()
    assert isinstance(a.error, OwnershipViolation)
    assert any(p["page"] == stolen and p["owner"] == b.slot for p in a.error.pages)
    assert a.slot not in engine.pool.provenance[stolen]  # a never wrote into b's page
    assert int(engine.pool.writer[stolen]) >> 32 == b.slot
    assert engine.scheduler.stray_pages == 1  # a's release left b's page alone
    engine.run_until_idle()
    assert b.state == RequestState.FINISHED


def test_pages_become_written_as_tokens_land(make_engine):
    engine = make_engine(page_size=16)
    req = engine.submit([256] * 16, SamplingParams(max_new_tokens=20, ignore_eos=True))
    engine.step()  # prefill: page 0 holds 16 tokens
    states = lambda: engine.pool.state[req.page_table.pages].tolist()  # noqa: E731
    assert states() == [PageState.WRITTEN, PageState.RESERVED, PageState.RESERVED]
    engine.step()  # decode writes position 16: the first token of page 1
    assert states() == [PageState.WRITTEN, PageState.WRITTEN, PageState.RESERVED]
    filled = engine.pool.filled[torch.from_numpy(req.page_table.pages.astype(np.int64))].tolist()
    assert filled == [16, 1, 0]


def test_a_page_another_request_wrote_into_flags_its_owner_when_it_reads_the_write(make_engine):
    # a's stale table names b's first page; a writes its token there over one b already
    # wrote, while b (same batch) writes into that page too and so restamps its writer tag.
    # With the defence off the write happens: b then reads a's data and must be reported.
    engine = make_engine(page_size=16, defences={"writer_tag_check": False})
    a = engine.submit([256] * 18, SamplingParams(max_new_tokens=8, ignore_eos=True), request_id="a")
    b = engine.submit([256] * 5, SamplingParams(max_new_tokens=8, ignore_eos=True), request_id="b")
    engine.step()  # both prefilled: b holds offsets 0-4 of its first page, a is at position 18
    engine.take_events()
    stolen = int(b.page_table.pages[0])
    a.page_table.pages[1] = stolen  # a writes position 18 to offset 2 of b's page
    engine.runner._tables_key = None
    engine.step()
    events = engine.take_events()
    reads = {e["request"] for e in events if e["kind"] == "cross_read"}
    caught = {e["request"] for e in events if e["kind"] == "ownership_violation"}
    assert engine.pool.provenance[stolen, 2] == a.slot  # the write happened
    assert reads == {"a", "b"}  # ground truth: each read the other's data
    assert caught == reads  # and the detector saw both
    b_pages = next(e["pages"] for e in events if e["kind"] == "ownership_violation" and e["request"] == "b")
    assert [p["page"] for p in b_pages] == [stolen]


def test_a_foreign_write_is_caught_where_it_is_read_and_nowhere_else(make_engine):
    # a's stale table names b's page: a writes position 24 into offset 8 of it. a then reads
    # b's slots 0-7 (caught). b is at position 5 and writes offset 8 itself at position 8,
    # before it ever attends to that slot: b never reads a's data, so it is never flagged
    # (a page-level check flagged b on every step: false positives).
    engine = make_engine(page_size=16, defences={"writer_tag_check": False})
    b = engine.submit([256] * 5, SamplingParams(max_new_tokens=6, ignore_eos=True), request_id="b")
    a = engine.submit([256] * 24, SamplingParams(max_new_tokens=2, ignore_eos=True), request_id="a")
    engine.step()
    engine.take_events()
    stolen = int(b.page_table.pages[0])
    a.page_table.pages[1] = stolen
    engine.runner._tables_key = None
    engine.step()  # a finishes
    events = engine.take_events()
    assert {e["request"] for e in events if e["kind"] == "ownership_violation"} == {"a"}
    assert {e["request"] for e in events if e["kind"] == "cross_read"} == {"a"}
    assert engine.pool.provenance[stolen, 8] == a.slot and int(engine.pool.token_writer[stolen, 8]) >> 32 == a.slot
    assert a.state == RequestState.FINISHED
    while b.state != RequestState.FINISHED:
        engine.step()
        events = engine.take_events()
        assert not [e for e in events if e["kind"] in ("ownership_violation", "cross_read")]
        if b.state != RequestState.FINISHED and b.num_tokens > 9:
            assert int(engine.pool.token_writer[stolen, 8]) >> 32 == b.slot  # b's own write replaced a's
