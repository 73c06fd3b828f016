"""PendingAsks: questions the supervisor put to its workers, from the ask to its answer.

Two kinds, both answered over the bus by ask id: a pool's page metadata (for a client's
`page_metadata`, or for the evidence journal's own keyframe) and the cross-request reads
each decode worker saw (`ground_truth`, gathered from every decode worker before the
client hears one answer). Asked and answered here only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.server.outbox import Outbox
from engine.server.worker_handle import WorkerHandle
from engine.wire.messages import to_client, to_worker
from engine.wire.protocol import error_reply


MsgId = int | str | None  # a client's message id, which its answer carries


@dataclass
class _Metadata:
    worker: str  # the worker asked
    client: bytes | None  # None: the supervisor's own ask, for the journal
    msg_id: MsgId
    reason: str  # the journal keyframe's


@dataclass
class _Truth:
    client: bytes
    msg_id: MsgId
    waiting: set[str]
    reads: list[dict[str, Any]] = field(default_factory=list)


class PendingAsks:
    def __init__(self, outbox: Outbox, request_of: Callable[[Any], str | None],
                 keyframe: Callable[[str, dict[str, np.ndarray], str], None]):
        """request_of(slot): the request id of a slot (None: forgotten or never seen).
        keyframe(pool, arrays, reason): a journal keyframe the supervisor asked for."""
        self.outbox, self.request_of, self.keyframe = outbox, request_of, keyframe
        self._ids = itertools.count(1)
        self.metadata: dict[int, _Metadata] = {}
        self.truth: dict[int, _Truth] = {}

    # ---- page metadata ------------------------------------------------------------------
    def page_metadata(self, worker: WorkerHandle, client: bytes | None, msg_id: MsgId = None, reason: str = "") -> None:
        """Ask `worker` for its pool's arrays; for a client (client, its message id) or, with
        client None, for the journal (the keyframe's reason)."""
        ask_id = next(self._ids)
        self.metadata[ask_id] = _Metadata(worker.name, client, msg_id, reason)
        self.outbox.to_worker(worker, to_worker.PageMetadata(ask_id=ask_id))

    def page_metadata_answered(self, worker: WorkerHandle, ask_id: int | None, pool: str | None,
                               arrays: dict[str, np.ndarray]) -> None:
        waiting = self.metadata.pop(ask_id, None) if ask_id is not None else None
        if waiting is None:
            return  # not ours, or asked before a restart
        if waiting.client is None:
            self.keyframe(str(pool or worker.name), arrays, waiting.reason)
        else:
            self.outbox.event(waiting.client, to_client.Reply(id=waiting.msg_id,
                                                              result={"pool": pool, "worker": worker.name}), arrays)

    # ---- ground truth ---------------------------------------------------------------------
    def cross_reads(self, workers: Iterable[WorkerHandle], client: bytes, msg_id: MsgId) -> None:
        """Ask every worker in `workers` for the cross-request reads it saw; the client hears
        once all have answered (at once when there are none)."""
        workers = list(workers)
        ask_id = next(self._ids)
        self.truth[ask_id] = _Truth(client, msg_id, {w.name for w in workers})
        for worker in workers:
            self.outbox.to_worker(worker, to_worker.CrossReads(ask_id=ask_id))
        if not workers:
            self._answer_truth(ask_id)

    def cross_reads_answered(self, worker: WorkerHandle, ask_id: int | None, reads: list[dict[str, Any]]) -> None:
        pending = self.truth.get(ask_id) if ask_id is not None else None
        if pending is None or ask_id is None:
            return
        pending.reads.extend({**read, "worker": worker.name} for read in reads if isinstance(read, dict))
        pending.waiting.discard(worker.name)
        if not pending.waiting:
            self._answer_truth(ask_id)

    def worker_gone(self, worker: WorkerHandle) -> None:
        """A worker stopped or crashed: it will not answer. A client waiting on its page
        metadata hears so now; a ground truth waiting on it finishes without it."""
        for ask_id, ask in list(self.metadata.items()):
            if ask.worker == worker.name:
                del self.metadata[ask_id]
                if ask.client is not None:
                    self.outbox.to_client(ask.client, error_reply(
                        ask.msg_id, "worker_gone", f"worker {ask.worker} went before it sent its page metadata"))
        for ask_id, pending in list(self.truth.items()):
            if worker.name in pending.waiting:
                pending.waiting.discard(worker.name)
                if not pending.waiting:
                    self._answer_truth(ask_id)

    def _answer_truth(self, ask_id: int) -> None:
        pending = self.truth.pop(ask_id)
        for read in pending.reads:
            read["reader"] = read.get("request")
            read["source"] = self.request_of(read.get("source_slot"))
        self.outbox.event(pending.client, to_client.Reply(id=pending.msg_id, result={"reads": pending.reads}))
