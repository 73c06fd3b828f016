"""Placement: the one writer of which worker holds which request; a worker's set and a
request's record agree through every step of the route and its unwinding."""

from __future__ import annotations

from pathlib import Path

from engine.server.placement import Placement
from engine.server.request_record import RequestRecord
from engine.server.worker_pool import WorkerPool


def _pool(tmp_path: Path) -> WorkerPool:
    def nothing(*args: object) -> None:
        return None

    return WorkerPool({"prefill": 1, "decode": 2}, tmp_path, "ipc://unused", config=dict, send=nothing,
                      on_spawn=nothing, on_silent=nothing, on_stop=nothing, on_exit=nothing)


def _rec(rid: str, slot: int) -> RequestRecord:
    return RequestRecord(rid, slot, "default", [1, 2, 3], {"max_new_tokens": 4}, None, None)


def test_placed_answered_and_ended(tmp_path):
    workers = _pool(tmp_path)
    placement = Placement(workers)
    decode, prefill = workers["decode-1"], workers["prefill-0"]
    a = _rec("a", 1)
    placement.to_decode(a, decode)
    placement.to_prefill(a, prefill)
    assert (a.decode_worker, a.prefill_worker) == ("decode-1", "prefill-0")
    assert placement.decode_of(a) is decode and placement.prefill_of(a) is prefill
    assert decode.inflight == {"a"} and prefill.inflight == {"a"}
    placement.let_go(prefill, "a")  # prefilled: the prefill side holds it no more
    assert not prefill.inflight and decode.inflight == {"a"}
    placement.ended(a)
    assert not decode.inflight
    assert a.decode_worker == "decode-1"  # who served it stays on its record


def test_a_failed_reservation_is_placed_nowhere(tmp_path):
    workers = _pool(tmp_path)
    placement = Placement(workers)
    a = _rec("a", 1)
    placement.to_decode(a, workers["decode-0"])
    placement.unreserved(a, workers["decode-0"])
    assert a.decode_worker is None and placement.decode_of(a) is None and not workers["decode-0"].inflight


def test_a_worker_that_went_gives_up_everything_once(tmp_path):
    workers = _pool(tmp_path)
    placement = Placement(workers)
    recs = [_rec(f"r{i}", i) for i in range(3)]
    for rec in recs:
        placement.to_decode(rec, workers["decode-0"])
    assert sorted(placement.take_all(workers["decode-0"])) == ["r0", "r1", "r2"]
    assert placement.take_all(workers["decode-0"]) == [] and not workers["decode-0"].inflight
