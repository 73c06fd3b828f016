"""PendingAsks: a question to the workers is answered once, to whoever asked, and a worker
that goes before it answers does not leave its asker waiting forever."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.server.pending_asks import PendingAsks
from engine.server.worker_pool import WorkerPool
from engine.wire.messages.codec import header_of
from engine.wire.protocol import pack, unpack


class _Outbox:
    """Records what would go out (the real one needs sockets)."""

    def __init__(self) -> None:
        self.workers: list[tuple[str, dict]] = []
        self.clients: list[tuple[bytes, dict, dict]] = []

    def to_worker(self, worker, message, arrays=None) -> None:
        self.workers.append((worker.name, header_of(message)))

    def to_client(self, identity, frames) -> None:
        msg = unpack([bytes(f) for f in frames])
        self.clients.append((identity, msg.header, dict(msg.arrays)))

    def event(self, identity, message, arrays=None) -> None:
        self.to_client(identity, pack(header_of(message), arrays))


def _setup(tmp_path: Path):
    def nothing(*args: object) -> None:
        return None

    workers = WorkerPool({"prefill": 1, "decode": 2}, tmp_path, "ipc://unused", config=dict, send=nothing,
                         on_spawn=nothing, on_silent=nothing, on_stop=nothing, on_exit=nothing)
    outbox, keyframes = _Outbox(), []
    asks = PendingAsks(outbox, request_of={7: "victim"}.get,  # type: ignore[arg-type]
                       keyframe=lambda pool, arrays, reason: keyframes.append((pool, reason)))
    return workers, outbox, asks, keyframes


def test_ground_truth_gathers_every_worker_then_answers_once(tmp_path):
    workers, outbox, asks, _ = _setup(tmp_path)
    d0, d1 = workers["decode-0"], workers["decode-1"]
    asks.cross_reads([d0, d1], b"client", 41)
    ask_id = outbox.workers[0][1]["ask_id"]
    assert [w for w, _ in outbox.workers] == ["decode-0", "decode-1"]
    asks.cross_reads_answered(d0, ask_id, [{"request": "reader", "source_slot": 7}])
    assert not outbox.clients  # decode-1 has not answered
    asks.cross_reads_answered(d1, ask_id, [])
    (identity, header, _), = outbox.clients
    assert identity == b"client" and header["id"] == 41
    assert header["result"]["reads"] == [{"request": "reader", "source_slot": 7, "worker": "decode-0",
                                          "reader": "reader", "source": "victim"}]
    asks.cross_reads_answered(d1, ask_id, [])  # a late duplicate changes nothing
    assert len(outbox.clients) == 1


def test_a_worker_that_goes_does_not_leave_its_asker_waiting(tmp_path):
    workers, outbox, asks, _ = _setup(tmp_path)
    d0, d1 = workers["decode-0"], workers["decode-1"]
    asks.cross_reads([d0, d1], b"truth", 1)
    asks.page_metadata(d1, b"meta", 2)
    asks.cross_reads_answered(d0, outbox.workers[0][1]["ask_id"], [])
    asks.worker_gone(d1)
    answers = {identity: header for identity, header, _ in outbox.clients}
    assert answers[b"truth"]["op"] == "reply" and answers[b"truth"]["result"]["reads"] == []
    assert answers[b"meta"]["op"] == "error" and answers[b"meta"]["error"]["code"] == "worker_gone"
    assert "decode-1" in answers[b"meta"]["error"]["message"]
    assert not asks.truth and not asks.metadata


def test_page_metadata_for_a_client_and_for_the_journal(tmp_path):
    workers, outbox, asks, keyframes = _setup(tmp_path)
    d0 = workers["decode-0"]
    asks.page_metadata(d0, b"client", 5)
    asks.page_metadata(d0, None, reason="alert fired")
    (_, first), (_, second) = outbox.workers
    arrays = {"owner": np.zeros(4, dtype=np.int32)}
    asks.page_metadata_answered(d0, second["ask_id"], "decode-0", arrays)
    asks.page_metadata_answered(d0, first["ask_id"], "decode-0", arrays)
    asks.page_metadata_answered(d0, first["ask_id"], "decode-0", arrays)  # answered once only
    assert keyframes == [("decode-0", "alert fired")]
    (identity, header, got), = outbox.clients
    assert identity == b"client" and header["result"] == {"pool": "decode-0", "worker": "decode-0"}
    assert got["owner"].shape == (4,)
